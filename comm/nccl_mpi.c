/*
 * ringattn's own NCCL communicator over the ranks of an MPI communicator
 * (ringattn_comm_create_nccl_mpi), the unique id broadcast from rank 0. In builds with MPI and
 * NCCL; the transport registry (comm/transports.c) tells the entry point whether this build has it.
 */
#include <mpi.h>
#include <string.h>

#include "base/error.h"
#include "comm/comm.h"
#include "comm/nccl_comm.h"
#include "comm/transports.h"

/* The device can be made current here (then put back), so NCCL's initialisation will not fail
   on it while the other ranks wait for this one until the deadline. */
static int device_usable(const ra_memory_ops *dev, int device)
{
    if (device < -1) return 0;
    const int previous = dev->set_device(device);
    if (previous < 0) return 0;
    dev->set_device(previous);
    return 1;
}

/* Every rank's flag; 1 when all are set. The caller's communicator: a blocking collective. */
static int all_ranks(MPI_Comm comm, int flag)
{
    return MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MIN, comm) == MPI_SUCCESS && flag;
}

ringattn_status_t ra__comm_create_nccl_over_mpi(const char *fn, const void *mpi_comm_p, int device,
                                                const ra_memory_ops *dev, ringattn_comm_t *out)
{
    const MPI_Comm mpi_comm = *(const MPI_Comm *)mpi_comm_p;
    RA_CHECK(mpi_comm != MPI_COMM_NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: mpi_comm: got MPI_COMM_NULL, expected an MPI communicator", fn);
    int rank = 0, size = 0;
    RA_CHECK(MPI_Comm_rank(mpi_comm, &rank) == MPI_SUCCESS &&
                 MPI_Comm_size(mpi_comm, &size) == MPI_SUCCESS,
             RINGATTN_ERR_COMM, "%s: MPI_Comm_rank/MPI_Comm_size failed", fn);
    /* Rank 0 makes the id; the others learn whether it could, so no rank waits for an id or a
       peer that will never come (a bad device on one rank fails them all at once, not at the
       deadline). */
    struct {
        int ok;
        ncclUniqueId id;
    } msg;
    memset(&msg, 0, sizeof msg);
    msg.ok = rank != 0 || ncclGetUniqueId(&msg.id) == ncclSuccess;
    const int usable = device_usable(dev, device), mine_ok = out != NULL && usable;
    RA_CHECK(all_ranks(mpi_comm, mine_ok), RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: rank %d of %d: %s; expected a handle to fill and a device of -1 (the current "
             "one) or the ordinal of a usable device on every rank", fn, rank, size,
             !out ? "out is NULL"
             : !usable ? "bad device"
                       : "another rank's arguments are bad");
    RA_CHECK(MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, 0, mpi_comm) == MPI_SUCCESS,
             RINGATTN_ERR_COMM, "%s: rank %d of %d: MPI_Bcast of the unique id failed", fn, rank,
             size);
    RA_CHECK(msg.ok, RINGATTN_ERR_COMM, "%s: rank %d of %d: ncclGetUniqueId failed on rank 0",
             fn, rank, size);
    ringattn_comm_t comm = NULL;
    ringattn_status_t st = ra__comm_create_nccl_id(fn, &msg.id, size, rank, device, dev, &comm);
    /* the same outcome on every rank: one that failed (its own message kept) fails them all */
    if (!all_ranks(mpi_comm, st == RINGATTN_SUCCESS)) {
        if (st == RINGATTN_SUCCESS) {
            ra__comm_destroy(comm);
            return ra__fail(RINGATTN_ERR_COMM, "%s: rank %d of %d: another rank could not join",
                            fn, rank, size);
        }
        return st;
    }
    *out = comm;
    return RINGATTN_SUCCESS;
}
