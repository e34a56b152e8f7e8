// A byte stream from rank 0 to every rank of the job (MPI_COMM_WORLD), pipelined: the stream
// moves in fixed-size chunks through a ring of buffers. On rank 0 a reader thread fills buffers
// ahead (`produce`), on every rank a writer thread drains them behind (`consume`), and the
// calling thread alone talks to MPI, keeping two chunk broadcasts (MPI_Ibcast) in flight, so
// reading, the network and writing overlap. Used by `crucible yeet` to send files that some
// node lacks. Without MPI (or with one rank) the chunks go straight from `produce` to `consume`
// (still on the two threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace crucible {

// Fills `buffer` with the next `size` bytes of the stream (rank 0 only).
using ChunkProducer = std::function<void(char* buffer, size_t size)>;
// Takes the next `size` bytes of the stream (every rank, rank 0 included).
using ChunkConsumer = std::function<void(const char* buffer, size_t size)>;

// Every rank must call it with the same `total` and `chunk_bytes` (at most 1 GiB). `produce` and
// `consume` each run on a thread of their own, chunks in order; an exception from either stops
// the stream and is rethrown here (the other ranks are then left waiting: their job is killed).
void BroadcastStream(uint64_t total, size_t chunk_bytes, const ChunkProducer& produce,
                     const ChunkConsumer& consume);

}  // namespace crucible
