// libFuzzer target: any byte string as a chat template must parse and render to text or end in a
// jinja::Error (syntax, unsupported, runtime, raised, limit), never a crash, a hang, an
// out-of-bounds read or another exception. It renders with a conversation like the detection
// probes' (src/sft/chat_template.cc), under tight limits so a runaway loop ends quickly.
#include <cstddef>
#include <cstdint>
#include <string>

#include "sft/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json variables = nlohmann::ordered_json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true,
    "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": " Grüße 👋 "},
                 {"role": "assistant", "content": "a</think>b", "tool_calls": [{"type": "function",
                  "function": {"name": "f", "arguments": {"x": 1.5, "y": [null, true]}}}]}]})");
  crucible::jinja::RenderLimits limits;
  limits.max_steps = 200000;
  limits.max_output_bytes = 1 << 20;
  try {
    crucible::jinja::Template::Parse(std::string(reinterpret_cast<const char*>(data), size))
        .Render(variables, limits);
  } catch (const crucible::jinja::Error&) {
  }
  return 0;
}
