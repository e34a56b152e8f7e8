// Internal to distributed/: the MPI communicator behind a Communicator. Only communicator.cc and
// mesh.cc include it, so nothing outside this folder sees MPI's headers.
#pragma once

#include <mpi.h>

namespace crucible {

struct MpiHandle {
  MPI_Comm comm = MPI_COMM_NULL;
  // MPI_Comm_free it when the communicator is released: a split, never MPI_COMM_WORLD or SELF.
  bool owned = false;
};

}  // namespace crucible
