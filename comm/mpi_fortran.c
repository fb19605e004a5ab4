/*
 * The MPI transport from a Fortran communicator handle (ringattn_comm_create_mpi_fortran), for
 * callers without mpi.h (Python through ctypes, from mpi4py's comm.py2f()): a Fortran handle is
 * a plain int, whatever the MPI's C handle type is. In builds with MPI; the transport registry
 * (comm/transports.c) tells the entry point whether this build has it.
 */
#include <limits.h>

#include "base/error.h"
#include "comm/mpi_impl.h"
#include "comm/transports.h"

ringattn_status_t ra__comm_create_mpi_fortran(const char *fn, int64_t fortran_comm,
                                              ringattn_comm_t *comm)
{
    RA_CHECK(fortran_comm >= INT_MIN && fortran_comm <= INT_MAX &&
                 (int64_t)(MPI_Fint)fortran_comm == fortran_comm,
             RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: fortran_comm: got %lld, expected a Fortran handle (an MPI_Fint, an int)", fn,
             (long long)fortran_comm);
    RA_TRY(ra__mpi_check_running(fn)); /* MPI_Comm_f2c needs MPI running */
    const MPI_Comm mpi_comm = MPI_Comm_f2c((MPI_Fint)fortran_comm);
    /* Open MPI gives a null pointer for a value that names no communicator (MPICH's handles
       are the values themselves: it cannot tell here) */
    RA_CHECK(mpi_comm != MPI_COMM_NULL && mpi_comm != (MPI_Comm)0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: fortran_comm: got %lld, which is MPI_COMM_NULL or names no communicator; "
             "expected MPI_Comm_c2f(comm) (mpi4py: comm.py2f()) of a live communicator",
             fn, (long long)fortran_comm);
    return ra__comm_create_mpi(fn, mpi_comm, comm);
}
