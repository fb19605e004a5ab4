/*
 * ringattn over NCCL (build with -DRINGATTN_ENABLE_NCCL=ON): the ring's shards move between
 * GPUs with ncclSend/ncclRecv on the transport's own stream, ordered with each call's stream by
 * events. Plans on such a comm use the CUDA backend on the communicator's device.
 *
 * What a call still waits for on the host, and why:
 * - its opening and closing agreements (every rank in the same call, every argument valid, the
 *   SPEC 9 maxima; then every rank's result): ncclAllReduce of a few int64 values, whose event
 *   the host polls against RINGATTN_COMM_TIMEOUT with ncclCommGetAsyncError between polls. The
 *   closing one queues behind the call's exchanges on the transport's stream, so a peer that
 *   never sends, or one that left the call, is RINGATTN_ERR_COMM within the deadline on every
 *   rank, never a hang;
 * - in a ring, the SPEC 9 scan's few values (they decide the agreement), and with a key bias
 *   its check and the top-k thresholds (host work, SPEC 6).
 * The exchanges themselves never make the host wait.
 */
#ifndef RINGATTN_NCCL_H
#define RINGATTN_NCCL_H

#include <nccl.h>

#include "ringattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Borrows the caller's communicator (a framework's): never destroyed or aborted by ringattn; on
   a transport failure the comm is failed here and the caller is told to abort its own. */
RINGATTN_API ringattn_status_t ringattn_comm_create_nccl(ncclComm_t comm, ringattn_comm_t *out);
/* Collective over nranks callers with the same id (from ncclGetUniqueId on one of them, passed
   by any means): ringattn's own non-blocking communicator on `device` (-1: the current one),
   destroyed with the comm and aborted when it fails. */
/* ncclGetUniqueId of the NCCL this library runs on, for callers that pass the id by their own
   means (the Python package broadcasts it over a torch.distributed group) and so need not load
   a second NCCL, whose id another version may not accept. The caller's process becomes the id's
   bootstrap root: it must be one of the ranks. */
RINGATTN_API ringattn_status_t ringattn_nccl_get_unique_id(ncclUniqueId *id);
RINGATTN_API ringattn_status_t ringattn_comm_create_nccl_id(const ncclUniqueId *id, int nranks,
                                                            int rank, int device,
                                                            ringattn_comm_t *out);

#ifdef __cplusplus
}
#endif

#endif
