/* MPI hello for the launcher's tests: every rank reports its node, and an allreduce proves the
 * ranks really talk to each other across the (virtual) nodes. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0, one = 1, sum = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  const char* node = getenv("CRUCIBLE_NODE");
  printf("step=1 mpi_rank=%d mpi_size=%d allreduce=%d node=%s crucible_rank=%s\n", rank, size, sum,
         node ? node : "?", getenv("CRUCIBLE_RANK") ? getenv("CRUCIBLE_RANK") : "?");
  fflush(stdout);
  MPI_Finalize();
  return 0;
}
