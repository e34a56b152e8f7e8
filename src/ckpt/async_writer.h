// Runs one checkpoint save at a time on a background thread, so the training loop only pays for
// copying its state into a host buffer. Errors of the background save are kept and rethrown on
// the caller's thread by the next Wait() or Rethrow().
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <thread>

namespace crucible {

class AsyncWriter {
 public:
  AsyncWriter() = default;
  ~AsyncWriter();  // waits for a running job (its error, if any, is dropped)
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Starts `job` on a new thread. The previous job must be finished (call Wait() first).
  void Start(std::function<void()> job);
  // True while a job runs.
  bool Busy() const { return running_ && !finished_.load(std::memory_order_acquire); }
  // Joins the running job, if any; rethrows its exception.
  void Wait();
  // Joins a job that already finished and rethrows its exception; never blocks on a running one.
  void Rethrow();

 private:
  std::thread thread_;
  bool running_ = false;
  std::atomic<bool> finished_{false};
  std::exception_ptr error_;
};

}  // namespace crucible
