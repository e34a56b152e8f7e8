// A byte stream from rank 0 to every rank of the job (MPI_COMM_WORLD), pipelined: the stream
// moves in fixed-size chunks through two buffers, so while one chunk is in flight (MPI_Ibcast)
// rank 0 reads the next into the other buffer and the other ranks write the previous one out.
// Used by `crucible yeet` to send files that some node lacks. Without MPI (or with one rank) the
// chunks go straight from `produce` to `consume`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace crucible {

// Fills `buffer` with the next `size` bytes of the stream (rank 0 only).
using ChunkProducer = std::function<void(char* buffer, size_t size)>;
// Takes the next `size` bytes of the stream (every rank, rank 0 included).
using ChunkConsumer = std::function<void(const char* buffer, size_t size)>;

// Every rank must call it with the same `total` and `chunk_bytes` (at most 1 GiB).
void BroadcastStream(uint64_t total, size_t chunk_bytes, const ChunkProducer& produce,
                     const ChunkConsumer& consume);

}  // namespace crucible
