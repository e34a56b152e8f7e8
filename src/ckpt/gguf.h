// GGUF export: one file that llama.cpp (and the tools built on it) runs with nothing else: GGUF
// version 3, its metadata (llama.cpp's "llama" architecture keys and the tokenizer), the tensor
// infos under llama.cpp's tensor names, then the tensors, each aligned to general.alignment (32).
// What it holds comes from the model's Hugging Face form (model/model.h, HfMapping), converted
// as llama.cpp's convert_hf_to_gguf.py converts a LlamaForCausalLM folder:
//
//   config.json key          GGUF key                          tensor (HF)                 GGUF
//   hidden_size              llama.embedding_length            model.embed_tokens.weight
//   token_embd.weight num_hidden_layers        llama.block_count layers.N.input_layernorm
//   blk.N.attn_norm intermediate_size        llama.feed_forward_length layers.N.self_attn.q_proj
//   blk.N.attn_q (*) num_attention_heads      llama.attention.head_count layers.N.self_attn.k_proj
//   blk.N.attn_k (*) num_key_value_heads      llama.attention.head_count_kv
//   layers.N.self_attn.v_proj   blk.N.attn_v rope_theta               llama.rope.freq_base
//   layers.N.self_attn.o_proj   blk.N.attn_output rms_norm_eps
//   llama.attention.layer_norm_rms_epsilon  post_attention_layernorm  blk.N.ffn_norm head_dim
//   llama.rope.dimension_count        layers.N.mlp.{gate,up,down}_proj  blk.N.ffn_{gate,up,down}
//   vocab_size               llama.vocab_size                  model.norm.weight output_norm.weight
//   (the run's training.seq_len) llama.context_length          lm_head.weight (untied)
//   output.weight
//
// (*) Crucible's RoPE rotates the two halves of each head (Hugging Face's rotate_half); llama.cpp's
// "llama" RoPE rotates adjacent pairs. So, as convert_hf_to_gguf.py does, the rows of each head of
// q_proj and k_proj are interleaved: GGUF row 2i is HF row i, GGUF row 2i+1 HF row head_dim/2 + i.
// A tied head writes no output.weight (llama.cpp then reads token_embd.weight).
//
// Tensor types: 1-D tensors (the norms) are always F32; the 2-D ones take the file's type. F16 and
// BF16 round to nearest even. Q8_0 is ggml's: blocks of 32 consecutive values of a row, an fp16
// scale d = max|x| / 127 and int8 values round(x / d) (half away from zero); a matrix whose rows
// are not a multiple of 32 long is written F16, as convert_hf_to_gguf.py does.
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
// weights. `name` is general.name, `context_length` llama.context_length, `tokenizer_path` a
// tokenizer.json (required: llama.cpp runs no GGUF without a vocabulary). UsageError (one line)
// for a model or tokenizer llama.cpp cannot run as written here: a model other than the Llama
// family (DeepSeek-V3 needs llama.cpp's "deepseek2" MLA layout, not written yet), a tokenizer that
// is not byte-level BPE or whose pre-tokenizer has no llama.cpp name, or one larger than the
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
