#include "distributed/stream_broadcast.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace crucible {
namespace {

constexpr uint64_t kBuffers = 6;   // chunks held at once: in flight, being read, being written
constexpr uint64_t kInFlight = 2;  // broadcasts started and not yet complete

// The three sides of the stream share a ring of buffers: chunk k lives in buffer k % kBuffers.
// `produced`, `received` and `consumed` count the chunks each side has finished; a buffer is free
// again once its chunk was consumed.
struct Ring {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t produced = 0, received = 0, consumed = 0;
  bool stop = false;
  std::exception_ptr error;

  // Waits until `ready()` holds or a side failed; returns false on failure.
  template <typename Ready>
  bool Wait(Ready ready) {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return stop || ready(); });
    return !stop;
  }
  void Advance(uint64_t* counter, uint64_t value) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      *counter = value;
    }
    changed.notify_all();
  }
  void Fail(std::exception_ptr failure) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = failure;
      stop = true;
    }
    changed.notify_all();
  }
};

}  // namespace

void BroadcastStream(uint64_t total, size_t chunk_bytes, const ChunkProducer& produce,
                     const ChunkConsumer& consume) {
  int initialized = 0, finalized = 0, size = 1, rank = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  const uint64_t chunks = (total + chunk_bytes - 1) / chunk_bytes;
  if (chunks == 0) return;
  auto chunk_size = [&](uint64_t k) {
    return static_cast<size_t>(std::min<uint64_t>(chunk_bytes, total - k * chunk_bytes));
  };
  const uint64_t buffer_count = std::min(kBuffers, chunks);
  std::vector<std::vector<char>> buffers(buffer_count);
  for (auto& buffer : buffers) buffer.resize(std::min<uint64_t>(chunk_bytes, total));
  auto buffer = [&](uint64_t k) { return buffers[k % buffer_count].data(); };
  Ring ring;
  const bool root = rank == 0;

  // Rank 0 reads ahead while the broadcasts run; every rank writes behind them.
  std::thread producer, consumer;
  if (root)
    producer = std::thread([&] {
      try {
        for (uint64_t k = 0; k < chunks; ++k) {
          if (!ring.Wait([&] { return k < ring.consumed + buffer_count; })) return;
          produce(buffer(k), chunk_size(k));
          ring.Advance(&ring.produced, k + 1);
        }
      } catch (...) {
        ring.Fail(std::current_exception());
      }
    });
  consumer = std::thread([&] {
    try {
      for (uint64_t k = 0; k < chunks; ++k) {
        if (!ring.Wait([&] { return k < ring.received; })) return;
        consume(buffer(k), chunk_size(k));
        ring.Advance(&ring.consumed, k + 1);
      }
    } catch (...) {
      ring.Fail(std::current_exception());
    }
  });

  // This thread alone calls MPI (MPI_THREAD_FUNNELED). It keeps up to kInFlight broadcasts
  // going, each into a buffer the writer has released (and, on rank 0, the reader has filled).
  std::vector<MPI_Request> requests(buffer_count, MPI_REQUEST_NULL);
  uint64_t started = 0;
  bool ok = true;
  for (uint64_t k = 0; k < chunks && ok; ++k) {
    while (ok && started < chunks && started < k + kInFlight) {
      const uint64_t s = started;
      ok = ring.Wait(
          [&] { return s < ring.consumed + buffer_count && (!root || s < ring.produced); });
      if (!ok) break;
      if (size > 1)
        MPI_Ibcast(buffer(s), static_cast<int>(chunk_size(s)), MPI_BYTE, 0, MPI_COMM_WORLD,
                   &requests[s % buffer_count]);
      ++started;
    }
    if (!ok) break;
    // Test and yield rather than MPI_Wait's busy spin, so that where ranks share cores the
    // reader and writer threads get them.
    for (int done = size > 1 ? 0 : 1; !done;) {
      MPI_Test(&requests[k % buffer_count], &done, MPI_STATUS_IGNORE);
      if (!done) sched_yield();
    }
    ring.Advance(&ring.received, k + 1);
  }
  if (!ok) ring.Fail(nullptr);
  if (producer.joinable()) producer.join();
  consumer.join();
  if (ring.error) std::rethrow_exception(ring.error);
}

}  // namespace crucible
