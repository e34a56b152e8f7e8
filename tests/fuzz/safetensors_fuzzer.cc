// libFuzzer target: SafetensorsReader must turn any byte string into either a parsed file or a
// crucible::Error (DataError), never a crash, a hang, an out-of-bounds read or another exception.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/safetensors.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    crucible::SafetensorsReader reader(std::string(reinterpret_cast<const char*>(data), size),
                                       "fuzz");
    for (const auto& tensor : reader.tensors()) {
      // The reader validated begin/end against the data section, so numel is bounded by the input.
      std::vector<float> floats(tensor.numel());
      try {
        reader.ReadFloat32(tensor.name, tensor.shape, floats.data());
      } catch (const crucible::Error&) {
      }
      if (tensor.dtype == "I32") {
        std::vector<int32_t> ints(tensor.numel());
        reader.ReadInt32(tensor.name, ints.data());
      }
    }
    (void)reader.metadata().size();
  } catch (const crucible::Error&) {
  }
  return 0;
}
