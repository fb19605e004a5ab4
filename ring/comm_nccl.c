/*
 * ringattn_comm_create_nccl / _nccl_id (include/ringattn_nccl.h): the NCCL transport
 * (comm/nccl.c) with the CUDA backend's device operations, and the unique id made by the same
 * NCCL that joins it. Builds with RINGATTN_HAVE_NCCL only.
 */
#include "ringattn_nccl.h"

#include "base/error.h"
#include "comm/nccl_comm.h"
#include "kernels/backend.h"

ringattn_status_t ringattn_comm_create_nccl(ncclComm_t comm, ringattn_comm_t *out)
{
    static const char fn[] = "ringattn_comm_create_nccl";
    RA_CHECK(comm != NULL && out != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: comm/out: got NULL, expected a NCCL communicator and a handle to fill", fn);
    RA_TRY(ra__comm_create_nccl(fn, comm, 0, ra__cuda_backend.device_ops, out));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_nccl_get_unique_id(ncclUniqueId *id)
{
    static const char fn[] = "ringattn_nccl_get_unique_id";
    RA_CHECK(id != NULL, RINGATTN_ERR_INVALID_ARGUMENT, "%s: id: got NULL", fn);
    ncclUniqueId made;
    const ncclResult_t r = ncclGetUniqueId(&made);
    RA_CHECK(r == ncclSuccess, RINGATTN_ERR_COMM, "%s: %s", fn, ncclGetErrorString(r));
    *id = made;
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_comm_create_nccl_id(const ncclUniqueId *id, int nranks, int rank,
                                               int device, ringattn_comm_t *out)
{
    static const char fn[] = "ringattn_comm_create_nccl_id";
    RA_CHECK(id != NULL && out != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: id/out: got NULL, expected a unique id and a handle to fill", fn);
    RA_CHECK(nranks >= 1 && rank >= 0 && rank < nranks, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: rank %d of %d, expected 0 <= rank < nranks", fn, rank, nranks);
    RA_CHECK(device >= -1, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: device: got %d, expected -1 (the current device) or a device ordinal", fn, device);
    const ra_device_ops *dev = ra__cuda_backend.device_ops;
    const int previous = dev->set_device(device);
    RA_CHECK(previous >= 0, RINGATTN_ERR_CUDA, "%s: device %d: cannot make it current", fn, device);
    /* non-blocking: the host polls the initialisation against the deadline */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t nc = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&nc, nranks, *id, rank, &config);
    if (nc) r = ra__nccl_settle(nc, r);
    const char *last = ncclGetLastError(nc); /* NCCL's detail, often empty */
    if (!last) last = "";
    ringattn_status_t st =
        r == ncclSuccess ? ra__comm_create_nccl(fn, nc, 1, dev, out)
                         : ra__fail(RINGATTN_ERR_COMM, "%s: rank %d of %d: %s%s%s%s", fn, rank,
                                    nranks,
                                    r == ncclInProgress ? "not every rank joined in time"
                                                        : ncclGetErrorString(r),
                                    *last ? " (" : "", last, *last ? ")" : "");
    if (st != RINGATTN_SUCCESS && nc) ncclCommAbort(nc);
    dev->set_device(previous);
    if (st == RINGATTN_SUCCESS) ra__clear_error();
    return st;
}
