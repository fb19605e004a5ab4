// The Catch2 main of the tests run under mpirun: MPI around the session, and every rank exits
// with the worst rank's result, so that mpirun's status is the same whichever rank failed.
#include <mpi.h>

#include "support/catch_session.hpp"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const int result = ra_catch_run(argc, argv);
    int worst = 0;
    MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return worst;
}
