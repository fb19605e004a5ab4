/* The NCCL transport's constructors (comm/nccl.c, comm/nccl_join.c), for the API's entry
   points. Internal. */
#ifndef RINGATTN_COMM_NCCL_COMM_H
#define RINGATTN_COMM_NCCL_COMM_H

#include <nccl.h>

#include "base/memory_ops.h"
#include "ringattn.h"

/* r, or once nc has settled the call that returned it: a non-blocking communicator's
   ncclInProgress polled (ncclCommGetAsyncError) until it ends or RINGATTN_COMM_TIMEOUT passes,
   which leaves it ncclInProgress. */
ncclResult_t ra__nccl_settle(ncclComm_t nc, ncclResult_t r);

/* A comm over nc (owned: ringattn made it, and aborts and destroys it), on nc's device. */
ringattn_status_t ra__comm_create_nccl(const char *fn, ncclComm_t nc, int owned,
                                       const ra_memory_ops *dev, ringattn_comm_t *out);

/* A unique id for ra__comm_create_nccl_id, made by the NCCL that will join it. */
ringattn_status_t ra__nccl_unique_id(const char *fn, ncclUniqueId *id);
/* Rank `rank` of nranks joined to id on `device` (-1: the current one; put back after), as a comm
   that owns its NCCL communicator. */
ringattn_status_t ra__comm_create_nccl_id(const char *fn, const ncclUniqueId *id, int nranks,
                                          int rank, int device, const ra_memory_ops *dev,
                                          ringattn_comm_t *out);

/* comm.h's split_grid over nc, this rank's of a comm on `device`: two ncclCommSplit (groups of
   `group` consecutive ranks, then the ranks at one place in every group), each a comm that owns
   its NCCL communicator. */
ringattn_status_t ra__nccl_split_grid(ncclComm_t nc, int rank, int group, int device,
                                      const ra_memory_ops *dev, ringattn_comm_t out[2]);

#endif
