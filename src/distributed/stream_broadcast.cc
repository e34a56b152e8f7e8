#include "distributed/stream_broadcast.h"

#include <mpi.h>

#include <algorithm>
#include <vector>

namespace crucible {

void BroadcastStream(uint64_t total, size_t chunk_bytes, const ChunkProducer& produce,
                     const ChunkConsumer& consume) {
  int initialized = 0, finalized = 0, size = 1, rank = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) {
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  std::vector<char> buffers[2] = {std::vector<char>(std::min<uint64_t>(chunk_bytes, total)),
                                  std::vector<char>(std::min<uint64_t>(chunk_bytes, total))};
  const uint64_t chunks = (total + chunk_bytes - 1) / chunk_bytes;
  auto chunk_size = [&](uint64_t k) {
    return static_cast<size_t>(std::min<uint64_t>(chunk_bytes, total - k * chunk_bytes));
  };
  if (size == 1) {
    for (uint64_t k = 0; k < chunks; ++k) {
      produce(buffers[0].data(), chunk_size(k));
      consume(buffers[0].data(), chunk_size(k));
    }
    return;
  }
  // Chunk k travels in buffer k % 2. Rank 0 fills a buffer just before its broadcast starts;
  // every rank consumes chunk k once its broadcast completed, then starts chunk k + 2 in it.
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  auto start = [&](uint64_t k) {
    char* buffer = buffers[k % 2].data();
    if (rank == 0) produce(buffer, chunk_size(k));
    MPI_Ibcast(buffer, static_cast<int>(chunk_size(k)), MPI_BYTE, 0, MPI_COMM_WORLD,
               &requests[k % 2]);
  };
  for (uint64_t k = 0; k < std::min<uint64_t>(2, chunks); ++k) start(k);
  for (uint64_t k = 0; k < chunks; ++k) {
    MPI_Wait(&requests[k % 2], MPI_STATUS_IGNORE);
    consume(buffers[k % 2].data(), chunk_size(k));
    if (k + 2 < chunks) start(k + 2);
  }
}

}  // namespace crucible
