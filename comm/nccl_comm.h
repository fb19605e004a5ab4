/* The NCCL transport's constructor (comm/nccl.c), for the API's entry points. Internal. */
#ifndef RINGATTN_COMM_NCCL_COMM_H
#define RINGATTN_COMM_NCCL_COMM_H

#include <nccl.h>

#include "base/device_ops.h"
#include "ringattn.h"

/* A comm over nc (owned: ringattn made it, and aborts and destroys it), on nc's device. */
ringattn_status_t ra__comm_create_nccl(const char *fn, ncclComm_t nc, int owned,
                                       const ra_device_ops *dev, ringattn_comm_t *out);

#endif
