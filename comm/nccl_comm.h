/* The NCCL transport's constructor (comm/nccl.c), for the API's entry points. Internal. */
#ifndef RINGATTN_COMM_NCCL_COMM_H
#define RINGATTN_COMM_NCCL_COMM_H

#include <nccl.h>

#include "base/device_ops.h"
#include "ringattn.h"

/* r, or once nc has settled the call that returned it: a non-blocking communicator's
   ncclInProgress polled (ncclCommGetAsyncError) until it ends or RINGATTN_COMM_TIMEOUT passes,
   which leaves it ncclInProgress. */
ncclResult_t ra__nccl_settle(ncclComm_t nc, ncclResult_t r);

/* A comm over nc (owned: ringattn made it, and aborts and destroys it), on nc's device. */
ringattn_status_t ra__comm_create_nccl(const char *fn, ncclComm_t nc, int owned,
                                       const ra_device_ops *dev, ringattn_comm_t *out);

#endif
