// The device memory check: a model that would not fit a device's free memory is refused before
// anything is allocated there, naming the device, what was asked and what is free.
#include <gtest/gtest.h>

#include "common/error.h"
#include "support/staged_backend.h"
#include "train/gemm_ceiling.h"
#include "train/memory_plan.h"

namespace crucible {
namespace {

std::shared_ptr<const ModelSpec> Debug() {
  Config config = Config::Defaults();
  return BuildModelSpec(config);
}

TEST(DeviceMemory, AModelThatDoesNotFitTheDeviceIsRefusedNamingWhatIsAskedAndFree) {
  const auto spec = Debug();
  TrainingShape shape;
  shape.micro_batch = 8, shape.seq_len = 256;
  StagedBackend device;
  const double needed =
      spec->PlannedBuffers(8, 256).total_bytes + 8 * spec->PlannedSizes().parameters;
  device.ReportDeviceMemory(needed, 2 * needed);  // exactly enough
  EXPECT_NO_THROW(CheckDeviceFits(*spec, shape, device, false));
  device.ReportDeviceMemory(needed - 1, 2 * needed);
  try {
    CheckDeviceFits(*spec, shape, device, false);
    FAIL() << "a model larger than the device's free memory was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    const std::string m = e.what();
    EXPECT_NE(m.find("training.device = \"staged\": the model needs"), std::string::npos) << m;
    EXPECT_NE(m.find("but staged device 0 has"), std::string::npos) << m;
    EXPECT_NE(m.find("mixed_precision_param = float32"), std::string::npos) << m;
    EXPECT_NE(m.find("lower training.local_batch_size or training.seq_len"), std::string::npos)
        << m;
  }
  // An optimizer that samples targets keeps the whole logits too.
  device.ReportDeviceMemory(needed, 2 * needed);
  EXPECT_THROW(CheckDeviceFits(*spec, shape, device, true), Error);
  device.ReportDeviceMemory(needed + spec->PlannedBuffers(8, 256).whole_logits_bytes, 2 * needed);
  EXPECT_NO_THROW(CheckDeviceFits(*spec, shape, device, true));
}

TEST(DeviceMemory, ABackendOnHostMemoryIsLeftToTheHostCheck) {
  const auto spec = Debug();
  TrainingShape shape;
  shape.micro_batch = 8, shape.seq_len = 256;
  StagedBackend device;  // reports no device memory
  EXPECT_NO_THROW(CheckDeviceFits(*spec, shape, device, false));
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

TEST(DeviceGemmCeiling, IsMeasuredThroughTheBackendsOwnProducts) {
  StagedBackend device;  // every product it runs checks that its operands are device memory
  const std::vector<GemmShape> shapes = {{64, 128, 96}, {64, 96, 128}};
  const double gflops = MeasureBackendGemmCeiling(device, shapes);
  EXPECT_GT(gflops, 0.0);
  EXPECT_LT(gflops, 1e5);  // a CPU behind the wall: far below 100 TFLOP/s
}

}  // namespace
}  // namespace crucible

namespace crucible {
namespace {

TEST(DeviceMemory, TheHostPlanLeavesADevicesActivationsToTheDeviceCheck) {
  Config config = Config::Defaults();
  const auto spec = BuildModelSpec(config);
  TrainingShape shape;
  shape.micro_batch = 8, shape.seq_len = 256, shape.accumulation = 1;
  const MemoryPlan host = PlanMemory(config, *spec, shape, 0, 1);
  const MemoryPlan device = PlanMemory(config, *spec, shape, 0, 1, /*activations_on_host=*/false);
  EXPECT_EQ(host.activations, spec->PlannedBuffers(8, 256).total_bytes);
  EXPECT_EQ(device.activations, 8.0 * 8 * 256);  // the targets and losses the host keeps
  EXPECT_EQ(device.model_state, host.model_state);
  EXPECT_EQ(device.batch, host.batch);
}

TEST(MemoryPlan, TheWholeLogitsArePlannedOnlyWhenTheForwardKeepsThem) {
  Config config = Config::Defaults();
  const auto spec = BuildModelSpec(config);
  TrainingShape shape;
  shape.micro_batch = 8, shape.seq_len = 256, shape.accumulation = 1;
  const BufferSizes buffers = spec->PlannedBuffers(8, 256);
  EXPECT_EQ(buffers.whole_logits_bytes, 4.0 * 8 * 256 * static_cast<double>(spec->vocab_size()));
  EXPECT_EQ(PlanMemory(config, *spec, shape, 0, 1).activations, buffers.total_bytes);
  // Loss weights computed from the forward (GRPO: TrainingShape::whole_logits).
  TrainingShape weighed = shape;
  weighed.whole_logits = true;
  EXPECT_EQ(PlanMemory(config, *spec, weighed, 0, 1).activations,
            buffers.total_bytes + buffers.whole_logits_bytes);
  // An optimizer that samples targets from them; both at once keep one copy.
  config.ApplyOverride("optimizer.name=SophiaG");
  EXPECT_EQ(PlanMemory(config, *spec, shape, 0, 1).activations,
            buffers.total_bytes + buffers.whole_logits_bytes);
  EXPECT_EQ(PlanMemory(config, *spec, weighed, 0, 1).activations,
            buffers.total_bytes + buffers.whole_logits_bytes);
}

}  // namespace
}  // namespace crucible
