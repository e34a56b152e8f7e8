// GGUF export: one file that llama.cpp (and the tools built on it) runs with nothing else: GGUF
// version 3, its metadata (general.*, the architecture's keys, the tokenizer), the tensor infos
// under llama.cpp's tensor names, then the tensors, each aligned to general.alignment (32). What
// it holds comes from the model's Hugging Face form (model/model.h, HfMapping), converted as
// llama.cpp's convert_hf_to_gguf.py converts that folder (ckpt/gguf_layout.cc).
//
// The Llama family: architecture "llama", as convert_hf_to_gguf.py's LlamaModel converts a
// LlamaForCausalLM (keys under "llama."; tensors of layer N under model.layers.N. and blk.N.):
//   hidden_size                         embedding_length
//   num_hidden_layers                   block_count
//   intermediate_size                   feed_forward_length
//   num_attention_heads                 attention.head_count
//   num_key_value_heads                 attention.head_count_kv
//   head_dim                            rope.dimension_count, attention.key_length, value_length
//   rope_theta                          rope.freq_base
//   rms_norm_eps                        attention.layer_norm_rms_epsilon
//   vocab_size                          vocab_size
//   (the run's training.seq_len)        context_length
//   model.embed_tokens.weight           token_embd.weight
//   input_layernorm                     attn_norm
//   self_attn.{q (*),k (*),v,o}_proj    attn_{q,k,v,output}
//   post_attention_layernorm            ffn_norm
//   mlp.{gate,up,down}_proj             ffn_{gate,up,down}
//   model.norm.weight                   output_norm.weight
//   lm_head.weight (untied)             output.weight
// (*) Crucible's RoPE rotates the two halves of each head (Hugging Face's rotate_half); llama.cpp's
// RoPE (LLAMA_ROPE_TYPE_NORM) rotates adjacent pairs. So, as convert_hf_to_gguf.py does, the rows
// of each head of q_proj and k_proj are interleaved: GGUF row 2i is HF row i, GGUF row 2i+1 HF
// row head_dim/2 + i. A tied head writes no output.weight (llama.cpp then reads token_embd).
//
// DeepSeek-V3: architecture "deepseek2", as convert_hf_to_gguf.py's DeepseekV2Model converts
// DeepSeek-V3's own DeepseekV3ForCausalLM folder, for llama.cpp's absorbed MLA (the queries meet
// the latent; keys under "deepseek2."). The embedding, norms, head, o_proj and the dense layers'
// MLP as Llama's; hidden_size, num_hidden_layers, intermediate_size (the dense layers'),
// num_attention_heads, rope_theta, rms_norm_eps, vocab_size and the context as Llama's, and:
//   (MLA: one latent shared by all)     attention.head_count_kv = 1
//   q_lora_rank (0: no compression)     attention.q_lora_rank (**)
//   kv_lora_rank                        attention.kv_lora_rank, attention.value_length
//   kv_lora_rank + qk_rope_head_dim     attention.key_length
//   qk_nope_head_dim + qk_rope_head_dim attention.key_length_mla
//   v_head_dim                          attention.value_length_mla
//   qk_rope_head_dim                    rope.dimension_count
//   first_k_dense_replace               leading_dense_block_count
//   n_routed_experts                    expert_count
//   num_experts_per_tok                 expert_used_count
//   n_group, topk_group                 expert_group_count, expert_group_used_count (***)
//   moe_intermediate_size               expert_feed_forward_length
//   n_shared_experts                    expert_shared_count
//   routed_scaling_factor               expert_weights_scale
//   norm_topk_prob (written when true)  expert_weights_norm
//   (DeepSeek-V3's sigmoid router)      expert_gating_func = 2 (sigmoid)
//   self_attn.q_a_proj, q_a_layernorm   attn_q_a, attn_q_a_norm
//   self_attn.q_b_proj (*)              attn_q_b (or self_attn.q_proj (*): attn_q)
//   self_attn.kv_a_proj_with_mqa (*)    attn_kv_a_mqa
//   self_attn.kv_a_layernorm            attn_kv_a_norm
//   self_attn.kv_b_proj (H, Dn + Dv, R) attn_k_b (H, R, Dn): each head's Dn key rows transposed,
//                                       attn_v_b (H, Dv, R): each head's Dv value rows
//   mlp.gate.weight (the router)        ffn_gate_inp (always F32, as convert_hf_to_gguf.py)
//   mlp.gate.e_score_correction_bias    exp_probs_b.bias
//   mlp.shared_experts.*_proj           ffn_{gate,up,down}_shexp
//   mlp.experts.e.*_proj, e = 0..E-1    ffn_{gate,up,down}_exps (E, rows, columns): stacked
// (shapes in Hugging Face's order, the last dimension contiguous; R = kv_lora_rank, Dn, Dr, Dv the
// nope, rope and value head widths.)
// (*) The RoPE rows, the last Dr rows of each query head and of kv_a_proj_with_mqa (k_pe), are
// interleaved as Llama's: DeepSeek's own checkpoints keep those pairs adjacent (transformers'
// rope_interleave), which convert_hf_to_gguf.py copies as they are; Crucible's are rotate-half.
// (**) convert_hf_to_gguf.py writes no q_lora_rank when it is null, but llama.cpp requires the key
// of every deepseek2 model but a few "lite" layer counts; 0 makes it read attn_q.
// (***) llama.cpp scores a group by its two largest biased scores, as Crucible does, and asserts
// that a group holds two experts; groups of one expert are written as one group (n_group 1,
// topk_group 1), the same choice (the topk_group best, then the best num_experts_per_tok of them).
// llama.cpp's router is then Crucible's (model/moe_routing.h): sigmoid affinities, the bias only
// choosing, the other groups masked to -inf, the top num_experts_per_tok, weights normalised and
// scaled; it guards the normalisation with max(sum, 2^-14) where Crucible adds 1e-20 (the same
// unless the chosen affinities sum below 6.1e-5). Refused (UsageError): MoE layers without
// shared experts (llama.cpp's deepseek2 requires ffn_*_shexp), more than 1024 routed experts
// (LLAMA_MAX_EXPERTS); for either family more than 512 layers (LLAMA_MAX_LAYERS).
//
// Tensor types: 1-D tensors (norms, biases) and MoE routers are always F32; the others take the
// file's type. F16 and BF16 round to nearest even. Q8_0 is ggml's: blocks of 32 consecutive values
// of a row, an fp16 scale d = max|x| / 127 and int8 values round(x / d) (half away from zero); a
// tensor whose rows are not a multiple of 32 long is written F16, as convert_hf_to_gguf.py does.
//
// The tokenizer (a byte-level BPE tokenizer.json) becomes tokenizer.ggml.model "gpt2" with its
// pre-tokenizer mapped to llama.cpp's name (GgufPreTokenizer), the tokens as tokenizer.json
// spells them (ids the tokenizer lacks up to the model's vocabulary are "[PAD<id>]", type
// unused), their types (normal; added special tokens control, other added tokens user-defined),
// the merges, the BOS and EOS ids, and add_bos_token / add_eos_token false: Crucible trains
// without a BOS, and its encode adds none.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "model/model.h"
#include "model/parameters.h"

namespace crucible {

enum class GgufFileType { kF32, kF16, kBF16, kQ8_0 };

// "f32", "f16", "bf16", "q8_0" (UsageError naming the flag otherwise), and back.
GgufFileType ParseGgufFileType(const std::string& name);
std::string GgufFileTypeName(GgufFileType type);

// Writes `out` (atomically: a temporary renamed over it) from the whole model's table and
// weights. `name` is general.name, `context_length` <architecture>.context_length,
// `tokenizer_path` a tokenizer.json (required: llama.cpp runs no GGUF without a vocabulary).
// UsageError (one line)
// for a model or tokenizer llama.cpp cannot run as written here: a model other than the Llama and
// DeepSeek-V3 families, a feature llama.cpp's architecture cannot represent (above), a tokenizer
// that is not byte-level BPE or whose pre-tokenizer has no llama.cpp name, or one larger than the
// model's vocabulary. Returns the bytes written.
size_t ExportGgufModel(const std::string& out, const ModelSpec& model, const ParameterTable& table,
                       const float* weights, int64_t context_length,
                       const std::string& tokenizer_path, GgufFileType type,
                       const std::string& name);

// llama.cpp's tokenizer.ggml.pre for the pre_tokenizer of a tokenizer.json (given as JSON text):
// "llama-bpe" for Llama 3's regex split then ByteLevel without its own regex, "gpt-2" for GPT-2's
// (ByteLevel with use_regex, or its regex split then ByteLevel), as `crucible tokenizer train
// --pretokenizer llama3|gpt2` writes them; "" for anything else.
std::string GgufPreTokenizer(const std::string& pre_tokenizer_json);

// The conversions, exposed for the tests. IEEE fp16 of `value`, rounded to nearest even
// (overflow to infinity, subnormals kept, NaN stays NaN); bf16 the same way.
uint16_t FloatToFp16Bits(float value);
uint16_t FloatToBf16Bits(float value);
// Q8_0 blocks of x[0, n) (n a multiple of 32) into out (n / 32 * 34 bytes).
void QuantizeQ8_0(const float* x, size_t n, uint8_t* out);

}  // namespace crucible
