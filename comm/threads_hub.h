/*
 * The threads transport's shared state (comm/threads.c), and its device part
 * (comm/threads_device.c): the same hub, whose messages a device comm moves as device-to-device
 * copies ordered by events instead of host memcpy. Internal.
 */
#ifndef RINGATTN_COMM_THREADS_HUB_H
#define RINGATTN_COMM_THREADS_HUB_H

#include <pthread.h>

#include "base/memory_ops.h"
#include "comm/comm.h"

/* A message on offer: one per send slot, in its exchange's impl bytes (it lives until the
   sender's wait returns, which unlinks it). */
typedef struct post {
    int src, dst, tag, consumed, live;
    const void *buf;
    size_t bytes;
    void *ready; /* device comm: the sender's event "the data is written" */
    struct post *next;
} post;

/* An exchange's transport state, in its impl bytes. */
typedef struct exchange_state {
    post posts[RA_EXCHANGE_SLOTS];
    void *compute;      /* device comm: the compute stream it was started on */
    unsigned sends, receives; /* device comm: bit i: slot i had a message at the start */
} exchange_state;

_Static_assert(sizeof(exchange_state) <= RA_EXCHANGE_IMPL_BYTES,
               "an exchange's state fits its impl bytes");
static inline exchange_state *state_of(ra_exchange *x) { return (exchange_state *)(void *)x->impl; }

/*
 * A rank's device objects (device comm): its comm stream, which runs the copies of the
 * messages it sends, and its events. `ready` is recorded on the compute stream when an exchange
 * starts: the data to send is written and the receive buffers are no longer read. `sent[i]`
 * and `received[i]` are recorded on the sender's comm stream after a copy; the sender's
 * compute stream waits on sent[i] before it may overwrite the sent buffer, the receiver's on
 * received[i] before it reads the message. Each is recorded again only in the rank's next
 * exchange, after the wait that consumed it, so no wait ever sees a later record.
 */
typedef struct dev_rank {
    void *stream, *ready;
    void *sent[RA_EXCHANGE_SLOTS], *received[RA_EXCHANGE_SLOTS];
    int busy; /* an exchange is in flight (at most one: the events are per rank) */
} dev_rank;

typedef struct hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int size, refs;
    post *posts;
    /* collectives, one at a time (every rank calls them in the same order) */
    int arrived;
    unsigned generation;
    int64_t acc[RA_ALLREDUCE_MAX], result[RA_ALLREDUCE_MAX];
    const void **gather_src; /* [size] */
    unsigned long moves;         /* messages completed on the hub: the ring's progress */
    int failed;                  /* some rank failed the comm: every wait ends */
    char reason[RA_COMM_REASON_BYTES];
    /* device comm: messages are device memory of `device`; NULL: host memory */
    const ra_memory_ops *dev;
    int device;
    dev_rank *ranks; /* [size] */
} hub;

/* comm.h's split_grid (comm/threads_split.c): new hubs, host or device as c's. */
ringattn_status_t ra__threads_split_grid(ringattn_comm_t c, int group, ringattn_comm_t out[2]);

/* comm/threads_device.c. Every rank's stream and events, on h->device (made current for it). */
ringattn_status_t ra__threads_device_make(hub *h);
/* Rank's stream and events (ranks destroy their comms one by one). */
void ra__threads_device_free(hub *h, int rank);
/* At an exchange's start, before its posts: records rank's `ready` on the compute stream. */
ringattn_status_t ra__threads_device_start(hub *h, int rank, ra_exchange *x, void *compute);
/* Lock held: queues message p into r (receive slot `slot` of rank `to`) on the sender's comm
   stream, after both ranks' `ready`. */
ringattn_status_t ra__threads_device_copy(hub *h, int to, int slot, const post *p, const ra_msg *r);
/* A completed exchange: its compute stream waits for the copies of its messages. */
ringattn_status_t ra__threads_device_finish(hub *h, int rank, ra_exchange *x);

#endif
