/*
 * The comm entry points of builds with MPI (include/ringattn_mpi.h): the MPI transport, and
 * ringattn's own NCCL communicator over an MPI communicator's ranks, which needs NCCL too (the
 * transport registry says whether this build has it; RINGATTN_ERR_UNSUPPORTED otherwise, so that
 * one program serves every build).
 */
#include "ringattn_mpi.h"

#include "base/error.h"
#include "comm/mpi_impl.h"
#include "comm/transports.h"
#include "kernels/backends.h"

ringattn_status_t ringattn_comm_create_mpi(MPI_Comm mpi_comm, ringattn_comm_t *comm)
{
    return ra__comm_create_mpi("ringattn_comm_create_mpi", mpi_comm, comm);
}

ringattn_status_t ringattn_comm_create_nccl_mpi(MPI_Comm mpi_comm, int device,
                                                ringattn_comm_t *out)
{
    static const char fn[] = "ringattn_comm_create_nccl_mpi";
    const ra_transport_info *nccl = ra__transport_find("nccl");
    if (!nccl->over_mpi) return ra__transport_absent(fn, "nccl");
    RA_CHECK(mpi_comm != MPI_COMM_NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: mpi_comm: got MPI_COMM_NULL, expected an MPI communicator", fn);
    RA_TRY(nccl->over_mpi(fn, &mpi_comm, device, ra__backend_device_memory(), out));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}
