/*
 * The transport table: one per transport (threads.c: ranks as threads of one process; mpi.c:
 * MPI ranks). MPI calls live only in comm/. Internal.
 *
 * Two planes. The control plane moves small host values and blocks: the agreements on a
 * descriptor or a call, allreduce, allgather (the key bias). The data plane moves shards:
 * batched exchanges, started in the order of a stream and waited for later, so that compute
 * overlaps them. Message tags are the transports' own: every rank starts the same exchanges in
 * the same order (the ring is in lock step), and each exchange takes the next tag.
 */
#ifndef RINGATTN_COMM_COMM_H
#define RINGATTN_COMM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "ringattn.h"

#define RA_ALLREDUCE_MAX 64
#define RA_EXCHANGE_SLOTS 2 /* messages per direction in one exchange */

typedef enum ra_reduce_op { RA_REDUCE_MIN, RA_REDUCE_MAX, RA_REDUCE_SUM } ra_reduce_op;

/* One message of an exchange; bytes = 0: nothing in this slot. */
typedef struct ra_msg {
    void *buf;
    size_t bytes;
    int peer;
} ra_msg;

/*
 * One batched exchange. The caller fills send[] and recv[]: send slot i goes to its peer, which
 * receives it in its recv slot i. Buffers, and the exchange itself, stay the caller's until
 * exchange_wait returns. The rest belongs to the transport (which may clear slots as their
 * messages complete): its per-exchange state lives in `impl`, so that starting an exchange
 * allocates nothing.
 */
#define RA_EXCHANGE_IMPL_BYTES 160

typedef struct ra_exchange {
    ra_msg send[RA_EXCHANGE_SLOTS], recv[RA_EXCHANGE_SLOTS];
    ringattn_comm_t comm;
    void *stream; /* host transports: the ra_host_stream it is attached to, or NULL */
    int tag;      /* slot i uses tag + i */
    _Alignas(16) unsigned char impl[RA_EXCHANGE_IMPL_BYTES];
} ra_exchange;

struct ra_comm_ops {
    const char *name;
    /* Control plane: in place over n <= RA_ALLREDUCE_MAX values on every rank. */
    ringattn_status_t (*allreduce_i64)(ringattn_comm_t c, int64_t *vals, int n, ra_reduce_op op);
    /* Control plane: rank r contributes bytes[r] bytes (send, on rank r); every rank receives
       them all into recv, rank after rank. */
    ringattn_status_t (*allgather)(ringattn_comm_t c, const void *send, void *recv,
                                   const size_t *bytes);
    /* Data plane: post the exchange after the work already ordered on stream (host
       transports: attached to the ra_host_stream, whose polls let it progress). */
    ringattn_status_t (*exchange_start)(ringattn_comm_t c, ra_exchange *x, void *stream);
    /* *done = 1 once the exchange has completed (exchange_wait is still called). */
    ringattn_status_t (*exchange_test)(ringattn_comm_t c, ra_exchange *x, int *done);
    /* Returns when the exchange completed, or with RINGATTN_ERR_COMM at the deadline. */
    ringattn_status_t (*exchange_wait)(ringattn_comm_t c, ra_exchange *x);
    void (*destroy)(ringattn_comm_t c);
};

struct ringattn_comm {
    const struct ra_comm_ops *ops;
    int rank, size;
    void *impl;
    unsigned exchanges; /* started so far: the next exchange's tags */
};

/* Seconds a wait may take before it is an error (RINGATTN_COMM_TIMEOUT, default 60). */
double ra__comm_timeout_s(void);

/* The first tag of the next exchange on c (slots add 0 .. RA_EXCHANGE_SLOTS - 1); every tag is
   below 32767, the least MPI_TAG_UB an MPI library may have. */
int ra__comm_next_tag(ringattn_comm_t c);

#endif
