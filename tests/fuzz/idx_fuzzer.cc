// libFuzzer target: ParseIndex must turn any byte string into either a validated Megatron .idx
// view or a crucible::Error (DataError), never a crash, a hang, an out-of-bounds read or another
// exception. On success every accessor the loader uses is walked, so a view that passed
// validation but points outside the input is caught by AddressSanitizer.
#include <cstddef>
#include <cstdint>

#include "common/error.h"
#include "data/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const crucible::IndexView view = crucible::ParseIndex(data, size, "fuzz.idx");
    int64_t tokens = 0;
    for (int64_t s = 0; s < view.sequence_count; ++s) {
      tokens += view.length(s);
      if (view.pointer(s) < 0) __builtin_trap();
    }
    for (int64_t d = 0; d <= view.document_count; ++d)
      if (view.document_begin(d) > view.sequence_count) __builtin_trap();
    if (tokens != view.total_tokens) __builtin_trap();
  } catch (const crucible::Error&) {
  }
  return 0;
}
