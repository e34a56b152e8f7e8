// The head widths of an attention: queries and keys (`qk`), values and outputs (`v`). Multi-head
// latent attention has v != qk (DeepSeek-V3: 192 and 128); one number is both (a Llama head), so
// a width converts to it.
#pragma once

#include <cstdint>

namespace crucible {

struct HeadDims {
  int64_t qk = 0, v = 0;
  HeadDims(int64_t d) : qk(d), v(d) {}  // NOLINT(google-explicit-constructor): one width is both
  HeadDims(int64_t qk_width, int64_t v_width) : qk(qk_width), v(v_width) {}
};

}  // namespace crucible
