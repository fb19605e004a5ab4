/*
 * The transport table: one per transport (threads.c: ranks as threads of one process; mpi.c:
 * MPI ranks; nccl.c: NCCL; custom.c: the caller's callbacks; transports.c lists a build's). MPI
 * and NCCL calls live only in comm/ (test_floors). Internal.
 *
 * Two planes. The control plane moves small host values and blocks: the agreements on a
 * descriptor or a call, allreduce, allgather (the key bias). The data plane moves shards:
 * batched exchanges, started in the order of a stream and waited for later, so that compute
 * overlaps them.
 *
 * Calls and failures (DESIGN, failure semantics). Every collective call of the library (plan
 * creation, forward, backward) opens with ra__comm_agree, one allreduce that carries the call's
 * identity: this comm's call number (plus the calls this process refused before they could
 * reach a comm: a NULL or destroyed plan), the kind of call and the plan. A mismatch fails the call
 * on every rank and brings the numbers back in step, so no call ever pairs with another. Every
 * message's tag carries the call number and the exchange's place in the call. Every wait has
 * a deadline of no progress for RINGATTN_COMM_TIMEOUT seconds (progress: a message moved, or a
 * heartbeat of a peer that computes or itself progresses). A transport error or a deadline
 * fails the comm for good: it tells the peers (who then fail at once too), and every later call
 * on it fails fast. The ring code reaches the transports only through the ra__comm_ wrappers
 * below, which enforce this.
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
#define RA_EXCHANGE_IMPL_BYTES 256

typedef struct ra_exchange {
    ra_msg send[RA_EXCHANGE_SLOTS], recv[RA_EXCHANGE_SLOTS];
    ringattn_comm_t comm;
    void *stream; /* host transports: the ra_call_stream it is attached to, or NULL */
    int tag;      /* slot i uses tag + i (ra__comm_next_tag) */
    unsigned call; /* the comm's call number when it started */
    int step;      /* the ring step it belongs to, for messages (set by the caller) */
    _Alignas(16) unsigned char impl[RA_EXCHANGE_IMPL_BYTES];
} ra_exchange;

/* The kinds of collective call, in every call's agreement. */
typedef enum ra_call_kind { RA_CALL_PLAN_CREATE = 1, RA_CALL_FORWARD, RA_CALL_BACKWARD } ra_call_kind;

struct ra_comm_ops {
    const char *name;
    /* Control plane: in place over n <= RA_ALLREDUCE_MAX values on every rank. */
    ringattn_status_t (*allreduce_i64)(ringattn_comm_t c, int64_t *vals, int n, ra_reduce_op op);
    /* Control plane: rank r contributes bytes[r] bytes (send, on rank r); every rank receives
       them all into recv, rank after rank. */
    ringattn_status_t (*allgather)(ringattn_comm_t c, const void *send, void *recv,
                                   const size_t *bytes);
    /* Data plane: post the exchange after the work already ordered on stream (host
       transports: attached to the ra_call_stream, whose polls let it progress). */
    ringattn_status_t (*exchange_start)(ringattn_comm_t c, ra_exchange *x, void *stream);
    /* *done = 1 once the exchange has completed (exchange_wait is still called). */
    ringattn_status_t (*exchange_test)(ringattn_comm_t c, ra_exchange *x, int *done);
    /* Returns when the exchange completed, or with RINGATTN_ERR_COMM after the deadline without
       progress. On an error the transport gives up the exchange; where it could not take back
       a message (an MPI send in flight), it counts it in the comm's `active` until it ends. */
    ringattn_status_t (*exchange_wait)(ringattn_comm_t c, ra_exchange *x);
    /* The comm has failed here (c->reason says why): tell every peer, without waiting. */
    void (*notify_failure)(ringattn_comm_t c);
    /* Has a peer failed the comm? Then its reason into c->reason and nonzero. */
    int (*peer_failed)(ringattn_comm_t c);
    /* Tests what c->active counts, updating it: 0 when nothing may still touch caller memory. */
    int (*still_active)(ringattn_comm_t c);
    /* This rank is computing (its kernels poll): tell the peers it is alive, at most every
       quarter deadline, so that a long step is not taken for a stall. */
    void (*beat)(ringattn_comm_t c);
    /* Optional (NULL: any stream): refuses a call's stream the transport cannot order its
       exchanges on, with a message naming fn. Checked before the call's agreement. */
    ringattn_status_t (*check_stream)(ringattn_comm_t c, const char *fn, void *stream);
    void (*destroy)(ringattn_comm_t c);
    /* Optional (NULL: the transport cannot split; ra__comm_split_grid says so). Collective over
       c, whose size is a multiple of `group`: the ranks form groups of `group` consecutive
       ranks. out[0]: this rank's group (its rank there c->rank % group, of group);
       out[1]: the ranks at this rank's place in every group (rank c->rank / group, of
       c->size / group). New comms of c's transport and memory, each failing on its own; the
       caller destroys them (before c). out[] comes NULL: on a failure what it holds then (the
       comms made before it) is destroyed by ra__comm_split_grid. */
    ringattn_status_t (*split_grid)(ringattn_comm_t c, int group, ringattn_comm_t out[2]);
    /* Optional (NULL: ra__comm_alltoall runs size - 1 rounds of exchanges): one all-to-all of
       one array in one request, send[r] to and recv[r] from rank r (bytes 0: nothing), waited
       for against the deadline, on host memory. */
    ringattn_status_t (*alltoall)(ringattn_comm_t c, const ra_msg *send, const ra_msg *recv);
};

#define RA_COMM_REASON_BYTES 384

struct ringattn_comm {
    const struct ra_comm_ops *ops;
    int rank, size;
    void *impl;
    unsigned calls;     /* collective calls entered on this comm (ra__comm_agree) */
    unsigned long refused_seen; /* the process's refused calls when its last agreement ended */
    int agreed;                 /* some agreement ran on it */
    unsigned exchanges; /* started in the current call: the next exchange's tags */
    const char *call_fn; /* the current call's public function (messages), a string constant */
    int failed;         /* set for good by a transport error, a deadline or a peer's failure */
    int active;         /* operations given up but still running over caller memory (MPI) */
    double last_beat;   /* when ops->beat last ran (ra__comm_now) */
    int on_device;      /* messages are device memory of `device` (a device comm); else host */
    int device;
    int refusals_elsewhere; /* split off another comm by the library (plan/grid.c): this
                               process's refused calls are carried by that comm's agreements,
                               never by this one's (ra__comm_agree) */
    /* During a 2D plan's call (api/grid_calls.c), on its ring comm: the group comm, whose
       peers wait in an agreement while this rank's ring runs. This comm's waits that still
       progress send heartbeats on it too (ra__comm_beat_companion), so that a slow but live
       ring elsewhere is not taken for a stall by the group. */
    ringattn_comm_t companion;
    int simulated;      /* a simulated world (comm/simulated.c): nothing moves, so plans of any
                           backend are made on it (to be sized), and their calls are refused */
    char reason[RA_COMM_REASON_BYTES]; /* why it failed */
};

/* The threads transport's hub and num_ranks comms on it (comm/threads.c); with dev, a device
   comm whose messages are device memory of `device` (-1: the current device). */
struct ra_memory_ops;
ringattn_status_t ra__comm_create_threads(const char *fn, int num_ranks,
                                          const struct ra_memory_ops *dev, int device,
                                          ringattn_comm_t *comms);

/* A comm over the caller's transport table (comm/custom.c; arguments checked by
   api/comms.c): the table is copied. */
struct ringattn_transport;
ringattn_status_t ra__comm_create_custom(const char *fn, const struct ringattn_transport *transport,
                                         int rank, int size, ringattn_comm_t *comm);

/* Destroys a live comm and returns 1; 0 (nothing done) when comm is NULL or not live. */
int ra__comm_destroy(ringattn_comm_t comm);

/* Seconds without progress before a wait is an error (RINGATTN_COMM_TIMEOUT, default 60). */
double ra__comm_timeout_s(void);
/* A monotonic clock, seconds. */
double ra__comm_now(void);

/* The first tag of the next exchange of the current call on c (slots add 0 ..
   RA_EXCHANGE_SLOTS - 1): the call number modulo 31 and the exchange's place in the call modulo
   512. Every tag is at most RA_COMM_TAG_MAX (32767 is the least MPI_TAG_UB an MPI may have). */
int ra__comm_next_tag(ringattn_comm_t c);
#define RA_COMM_TAG_MAX 32765
#define RA_COMM_TAG_ALIVE 32766   /* a waiting rank that still progresses (MPI heartbeats) */
#define RA_COMM_TAG_FAILURE 32767 /* the notice of a failed comm (MPI) */

/*
 * The agreement that opens a collective call of kind on plan (its creation's call number; 0
 * for plan creation). local: this rank's own check of its arguments. vals[n] (n <= 48, may be
 * NULL when n = 0) are reduced with MIN on every rank when every check passed. Returns local
 * when it failed; otherwise an error naming the first rank that refused, or the mismatch of
 * call numbers, kinds or plans; on a failed comm RINGATTN_ERR_COMM at once.
 */
ringattn_status_t ra__comm_agree(ringattn_comm_t c, const char *fn, ra_call_kind kind,
                                 unsigned plan, ringattn_status_t local, int64_t *vals, int n);
/* The agreement that closes a call: every rank returns the first failing rank's status. */
ringattn_status_t ra__comm_conclude(ringattn_comm_t c, const char *fn, ringattn_status_t local);
/* A collective call refused before it reached its comm (a NULL or destroyed plan or comm): the
   next agreement of every comm of this process carries it and fails on every rank, so that
   their peers do not pair their call with this rank's next one (ra__comm_agree). */
void ra__comm_refused(void);

/* The transport's check of a call's stream (ops->check_stream), before the call's agreement. */
ringattn_status_t ra__comm_check_stream(ringattn_comm_t c, const char *fn, void *stream);

/* The transport entry points the ring uses: they fail fast on a failed comm, fail the comm on
   any transport error, and name the peer/step in the message. */
ringattn_status_t ra__comm_allgather(ringattn_comm_t c, const void *send, void *recv,
                                     const size_t *bytes);
ringattn_status_t ra__comm_start(ringattn_comm_t c, ra_exchange *x, void *stream);
ringattn_status_t ra__comm_wait(ringattn_comm_t c, ra_exchange *x);
/* While a call's ring runs, the kernels' polls of stream send c's heartbeats (ops->beat). */
void ra__comm_beacon_attach(ringattn_comm_t c, void *stream);
void ra__comm_beacon_detach(ringattn_comm_t c, void *stream);
/*
 * An all-to-all on the data plane, as c->size - 1 rounds of one exchange each (so that it has
 * every transport's call identity, deadlines and failures): in round k = 1 .. P - 1 this rank
 * sends to rank (r + k) % P and receives from rank (r - k) % P. Array i (< slots <=
 * RA_EXCHANGE_SLOTS) sends send[i * P + peer] and receives recv[i * P + peer] (the peer fields
 * are set here; this rank's own entries are not read; bytes 0: nothing moves). Ordered on
 * stream as the exchanges are (comm.h); `step` names it in messages. A transport with an
 all-to-all of its own (ops->alltoall: the custom transport's alltoall_start) moves one array in
 one request instead.
 */
ringattn_status_t ra__comm_alltoall(ringattn_comm_t c, const ra_msg *send, const ra_msg *recv,
                                    int slots, void *stream, int step);
/* The transport's own all-to-all of one array (ops->alltoall, which must be set): fails fast
   on a failed comm and fails the comm on a transport error, as ra__comm_start does. */
ringattn_status_t ra__comm_alltoall_op(ringattn_comm_t c, const ra_msg *send, const ra_msg *recv);
/* The transport's split_grid (comm.h ops), or RINGATTN_ERR_UNSUPPORTED naming fn and the
   transport when it has none; a failed comm fails at once. */
ringattn_status_t ra__comm_split_grid(ringattn_comm_t c, const char *fn, int group,
                                      ringattn_comm_t out[2]);
/* c's companion (if any) gets a heartbeat, at most every quarter deadline (a transport's wait
   that still progresses calls it). */
void ra__comm_beat_companion(ringattn_comm_t c);
/* May buffers that c's transport could still use go? pinned: a call on them failed with a
   transport error. Not while c says something still runs over caller memory (an MPI send
   cannot be cancelled): then the log (as rank of ranks) says that `what`, `bytes` of it, stays
   allocated. */
int ra__comm_buffers_free_to_go(ringattn_comm_t c, int pinned, const char *what, size_t bytes,
                                int rank, int ranks);
/* Called with the failure's message recorded (ra__last_error): the comm is failed. */
ringattn_status_t ra__comm_fail(ringattn_comm_t c, ringattn_status_t st);

#endif
