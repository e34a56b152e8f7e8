#include "ckpt/async_writer.h"

#include "common/error.h"

namespace crucible {

AsyncWriter::~AsyncWriter() {
  if (thread_.joinable()) thread_.join();
}

void AsyncWriter::Start(std::function<void()> job) {
  if (running_) throw Error(kExitFailure, "internal: AsyncWriter::Start while a job runs");
  finished_.store(false, std::memory_order_release);
  error_ = nullptr;
  running_ = true;
  thread_ = std::thread([this, job = std::move(job)]() {
    try {
      job();
    } catch (...) {
      error_ = std::current_exception();
    }
    finished_.store(true, std::memory_order_release);
  });
}

void AsyncWriter::Wait() {
  if (!running_) return;
  thread_.join();
  running_ = false;
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

void AsyncWriter::Rethrow() {
  if (running_ && finished_.load(std::memory_order_acquire)) Wait();
}

}  // namespace crucible
