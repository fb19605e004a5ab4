/*
 * The ring's transport table (DESIGN "two small tables"): one per transport (self.c: ranks as
 * threads of one process; mpi.c: MPI ranks). MPI calls live only in comm/. Internal.
 */
#ifndef RINGATTN_COMM_COMM_H
#define RINGATTN_COMM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "ringattn.h"

#define RA_ALLREDUCE_MAX 64

typedef enum ra_reduce_op { RA_REDUCE_MIN, RA_REDUCE_MAX, RA_REDUCE_SUM } ra_reduce_op;

/* One non-blocking send + receive pair; opaque to the ring driver. */
typedef struct ra_request {
    void *ptr[2];
    int64_t val[3];
} ra_request;

struct ra_comm_ops {
    const char *name;
    /* Starts sending send_bytes of sendbuf to rank dst and receiving recv_bytes from rank src
       (either may be skipped with bytes = 0). Buffers stay the caller's until wait returns. */
    ringattn_status_t (*sendrecv_start)(ringattn_comm_t c, const void *sendbuf, size_t send_bytes,
                                        int dst, void *recvbuf, size_t recv_bytes, int src,
                                        int tag, ra_request *req);
    /* Lets the transfer progress; *done = 1 once it has completed (then no wait is needed). */
    ringattn_status_t (*test)(ringattn_comm_t c, ra_request *req, int *done);
    ringattn_status_t (*wait)(ringattn_comm_t c, ra_request *req);
    /* In place over n <= RA_ALLREDUCE_MAX values on every rank (plan checks, thresholds). */
    ringattn_status_t (*allreduce_i64)(ringattn_comm_t c, int64_t *vals, int n, ra_reduce_op op);
    void (*destroy)(ringattn_comm_t c);
};

/* Seconds a wait may take before it is an error (RINGATTN_COMM_TIMEOUT, default 60). */
double ra__comm_timeout_s(void);

struct ringattn_comm {
    const struct ra_comm_ops *ops;
    int rank, size;
    void *impl;
};

#endif
