/*
 * ringattn's own NCCL communicator: the unique id, and the join of nranks ranks to it on a
 * device (ringattn_nccl_get_unique_id, ringattn_comm_create_nccl_id). NCCL builds only.
 */
#include "base/error.h"
#include "comm/nccl_comm.h"

ringattn_status_t ra__nccl_unique_id(const char *fn, ncclUniqueId *id)
{
    ncclUniqueId made;
    const ncclResult_t r = ncclGetUniqueId(&made);
    RA_CHECK(r == ncclSuccess, RINGATTN_ERR_COMM, "%s: %s", fn, ncclGetErrorString(r));
    *id = made;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__comm_create_nccl_id(const char *fn, const ncclUniqueId *id, int nranks,
                                          int rank, int device, const ra_memory_ops *dev,
                                          ringattn_comm_t *out)
{
    RA_CHECK(nranks >= 1 && rank >= 0 && rank < nranks, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: rank %d of %d, expected 0 <= rank < nranks", fn, rank, nranks);
    RA_CHECK(device >= -1, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: device: got %d, expected -1 (the current device) or a device ordinal", fn, device);
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
    return st;
}
