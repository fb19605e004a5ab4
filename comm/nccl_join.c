/*
 * ringattn's own NCCL communicators: the unique id, the join of nranks ranks to it on a device
 * (ringattn_nccl_get_unique_id, ringattn_comm_create_nccl_id), and the splits of a comm for a 2D
 * plan (comm.h's split_grid). NCCL builds only.
 */
#include "base/error.h"
#include "comm/comm.h"
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

/*
 * Both splits on every rank, whatever the first gave (ncclCommSplit is collective over nc: no
 * rank may skip one), non-blocking and settled against the deadline: the new communicator, then
 * nc, which takes no other call before its split has ended. Then each a comm that owns its
 * communicator; one that is no comm's is aborted.
 */
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0) /* ncclCommSplit's first release */
ringattn_status_t ra__nccl_split_grid(ncclComm_t nc, int rank, int group, int device,
                                      const ra_memory_ops *dev, ringattn_comm_t out[2])
{
    static const char fn[] = "ringattn comm nccl: split";
    const int previous = dev->set_device(device);
    RA_CHECK(previous >= 0, RINGATTN_ERR_CUDA, "%s: device %d: cannot make it current", fn, device);
    const int colors[2] = {rank / group, rank % group}; /* key: rank, so ranks keep their order */
    ncclComm_t part[2] = {NULL, NULL};
    ringattn_status_t st = RINGATTN_SUCCESS;
    for (int i = 0; i < 2; ++i) {
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        ncclResult_t r = ncclCommSplit(nc, colors[i], rank, &part[i], &config);
        if (part[i]) r = ra__nccl_settle(part[i], r);
        if (r == ncclSuccess) r = ra__nccl_settle(nc, ncclInProgress);
        if (st == RINGATTN_SUCCESS && r != ncclSuccess)
            st = ra__fail(RINGATTN_ERR_COMM, "%s: rank %d: ncclCommSplit: %s", fn, rank,
                          r == ncclInProgress ? "not every rank split in time"
                                              : ncclGetErrorString(r));
    }
    for (int i = 0; i < 2; ++i) { /* what a failure leaves in out[] goes (comm.h) */
        if (st == RINGATTN_SUCCESS) st = ra__comm_create_nccl(fn, part[i], 1, dev, &out[i]);
        if (!out[i] && part[i]) ncclCommAbort(part[i]);
    }
    dev->set_device(previous);
    return st;
}
#else
ringattn_status_t ra__nccl_split_grid(ncclComm_t nc, int rank, int group, int device,
                                      const ra_memory_ops *dev, ringattn_comm_t out[2])
{
    return ra__fail(RINGATTN_ERR_UNSUPPORTED,
                    "ringattn comm nccl: split: NCCL %d.%d has no ncclCommSplit (2.18 or later "
                    "has): pass the group and ring comms to ringattn_plan_create_2d",
                    NCCL_MAJOR, NCCL_MINOR);
}
#endif
