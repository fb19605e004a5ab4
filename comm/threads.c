/*
 * The "threads" transport: N ranks as threads of one process (fast ring tests without mpirun,
 * and in-process users). Messages are matched like MPI's (source, tag) and copied straight
 * from the sender's buffer, which the sender keeps until its wait returns. Every wait has a
 * deadline of no progress for RINGATTN_COMM_TIMEOUT seconds (default 60): a rank that never
 * answers is an error, not a hang. A failure on one rank fails the hub: every rank's waits end
 * at once (comm.h). A device comm (comm/threads_device.c) keeps the same matching and
 * deadlines; its messages are device memory, copied on the device in stream order. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/call_stream.h"
#include "base/registry.h"
#include "comm/comm.h"
#include "comm/threads_hub.h"

/* RINGATTN_COMM_TIMEOUT from now, for pthread_cond_timedwait (CLOCK_REALTIME). */
static struct timespec deadline(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    const double s = ra__comm_timeout_s();
    const long ns = ts.tv_nsec + (long)((s - (double)(time_t)s) * 1e9);
    ts.tv_sec += (time_t)s + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    return ts;
}

static ringattn_status_t hub_failed(ringattn_comm_t c, const hub *h)
{
    return ra__fail(RINGATTN_ERR_COMM, "ringattn comm threads: rank %d: %s", c->rank, h->reason);
}

static void unlink_post(hub *h, post *p)
{
    for (post **pp = &h->posts; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    p->live = 0;
}

/* One matching attempt, lock held. Returns 1 when the exchange is complete. Every message
   completed counts in h->moves (the receiver copies it), the progress the waits watch. */
static int progress_locked(ringattn_comm_t c, hub *h, ra_exchange *x, ringattn_status_t *st)
{
    int complete = 1;
    ringattn_status_t e;
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i) {
        ra_msg *r = &x->recv[i];
        for (post *p = h->posts; r->bytes && p; p = p->next) {
            if (p->consumed || p->dst != c->rank || p->src != r->peer || p->tag != x->tag + i)
                continue;
            if (p->bytes != r->bytes)
                *st = ra__fail(RINGATTN_ERR_COMM,
                               "ringattn comm %s: message from rank %d: got %zu bytes, "
                               "expected %zu",
                               c->ops->name, p->src, p->bytes, r->bytes);
            else if (!h->dev) memcpy(r->buf, p->buf, p->bytes);
            else if ((e = ra__threads_device_copy(h, c->rank, i, p, r)) != RINGATTN_SUCCESS)
                *st = e; /* a later success does not hide it */
            p->consumed = 1;
            r->bytes = 0; /* received */
            ++h->moves;
            pthread_cond_broadcast(&h->cv);
            break;
        }
        post *mine = &state_of(x)->posts[i];
        if (mine->live && mine->consumed) unlink_post(h, mine);
        complete = complete && !r->bytes && !mine->live;
    }
    return complete;
}

static void th_poll(void *ctx)
{
    ra_exchange *x = ctx;
    hub *h = x->comm->impl;
    ringattn_status_t st = RINGATTN_SUCCESS; /* a failure shows again in the wait */
    pthread_mutex_lock(&h->mu);
    (void)progress_locked(x->comm, h, x, &st);
    pthread_mutex_unlock(&h->mu);
}

/* Gives up an exchange, lock held: its posts withdrawn (their buffers back to the sender), its
   receives dropped. Returns a peer it still waited for: to receive from, else to take a post. */
static int give_up_locked(hub *h, ra_exchange *x)
{
    int from = -1;
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i)
        if (x->recv[i].bytes && from < 0) from = x->recv[i].peer;
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i) {
        post *mine = &state_of(x)->posts[i];
        from = mine->live && from < 0 ? mine->dst : from; /* read before unlink_post clears it */
        if (mine->live) unlink_post(h, mine);
        x->recv[i].bytes = 0;
    }
    return from;
}

static ringattn_status_t th_start(ringattn_comm_t c, ra_exchange *x, void *stream)
{
    hub *h = c->impl;
    x->comm = c;
    x->tag = ra__comm_next_tag(c);
    x->stream = NULL;
    post *mine = state_of(x)->posts;
    void *ready = NULL;
    if (h->dev) {
        RA_TRY(ra__threads_device_start(h, c->rank, x, stream));
        ready = h->ranks[c->rank].ready;
    }
    pthread_mutex_lock(&h->mu);
    post **tail = &h->posts;
    while (*tail) tail = &(*tail)->next;
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i) {
        mine[i] = (post){c->rank, x->send[i].peer, x->tag + i, 0, x->send[i].bytes > 0,
                         x->send[i].buf, x->send[i].bytes, ready, NULL};
        if (!mine[i].live) continue;
        *tail = &mine[i];
        tail = &mine[i].next;
    }
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    /* a host comm progresses while the CPU kernels poll; a device comm's copies are queued
       when the receiver matches them (start, test, wait) and run on the device */
    if (!h->dev && stream && ra__call_stream_attach(stream, th_poll, x) == 0) x->stream = stream;
    ringattn_status_t st = RINGATTN_SUCCESS;
    if (h->dev) { /* queue the copies of messages already on offer */
        pthread_mutex_lock(&h->mu);
        (void)progress_locked(c, h, x, &st);
        if (st != RINGATTN_SUCCESS) give_up_locked(h, x); /* no wait follows a failed start */
        pthread_mutex_unlock(&h->mu);
        if (st != RINGATTN_SUCCESS) h->ranks[c->rank].busy = 0;
    }
    return st;
}

static ringattn_status_t th_test(ringattn_comm_t c, ra_exchange *x, int *done)
{
    hub *h = c->impl;
    ringattn_status_t st = RINGATTN_SUCCESS;
    pthread_mutex_lock(&h->mu);
    *done = progress_locked(c, h, x, &st);
    pthread_mutex_unlock(&h->mu);
    return st;
}

static ringattn_status_t th_wait(ringattn_comm_t c, ra_exchange *x)
{
    hub *h = c->impl;
    ringattn_status_t st = RINGATTN_SUCCESS;
    if (x->stream) ra__call_stream_detach(x->stream, x);
    x->stream = NULL;
    struct timespec until = deadline();
    pthread_mutex_lock(&h->mu);
    unsigned long seen = h->moves;
    while (!progress_locked(c, h, x, &st)) {
        if (h->failed) {
            give_up_locked(h, x);
            st = hub_failed(c, h);
            break;
        }
        /* the deadline counts time without progress anywhere in the ring: this rank may wait
           on one that waits on a slow one (comm/mpi_exchange.c's heartbeats, in one process) */
        if (h->moves != seen) {
            seen = h->moves;
            until = deadline();
        }
        if (pthread_cond_timedwait(&h->cv, &h->mu, &until) != ETIMEDOUT) continue;
        const int from = give_up_locked(h, x);
        st = ra__fail(RINGATTN_ERR_COMM,
                      "ringattn comm threads: rank %d: no progress for %g s waiting for rank %d",
                      c->rank, ra__comm_timeout_s(), from);
        break;
    }
    pthread_mutex_unlock(&h->mu);
    if (h->dev) { /* the compute stream waits for the copies (only after a complete exchange) */
        const ringattn_status_t done = st == RINGATTN_SUCCESS && !h->failed
                                           ? ra__threads_device_finish(h, c->rank, x)
                                           : RINGATTN_SUCCESS;
        h->ranks[c->rank].busy = 0;
        if (st == RINGATTN_SUCCESS) st = done;
    }
    return st;
}

/* Every rank at the same point, lock held; RINGATTN_ERR_COMM after the deadline without
   progress on the hub (a rank still computing beats, th_beat). */
static ringattn_status_t barrier_locked(ringattn_comm_t c, hub *h, struct timespec until,
                                        const char *what)
{
    if (h->failed) return hub_failed(c, h);
    if (++h->arrived == h->size) {
        h->arrived = 0;
        ++h->generation;
        pthread_cond_broadcast(&h->cv);
        return RINGATTN_SUCCESS;
    }
    const unsigned gen = h->generation;
    unsigned long seen = h->moves;
    while (gen == h->generation) {
        if (h->failed) return hub_failed(c, h);
        if (h->moves != seen) {
            seen = h->moves;
            until = deadline();
        }
        if (pthread_cond_timedwait(&h->cv, &h->mu, &until) == ETIMEDOUT && gen == h->generation) {
            --h->arrived; /* withdrawn: no rank passes a barrier that failed here (split_grid) */
            return ra__fail(RINGATTN_ERR_COMM,
                            "ringattn comm threads: rank %d: %s: no answer from some rank for "
                            "%g s",
                            c->rank, what, ra__comm_timeout_s());
        }
    }
    return RINGATTN_SUCCESS;
}

static void combine(int64_t *acc, const int64_t *v, int n, ra_reduce_op op)
{
    for (int i = 0; i < n; ++i) {
        if (op == RA_REDUCE_SUM) acc[i] += v[i];
        else if (op == RA_REDUCE_MIN) acc[i] = v[i] < acc[i] ? v[i] : acc[i];
        else acc[i] = v[i] > acc[i] ? v[i] : acc[i];
    }
}

static ringattn_status_t th_allreduce(ringattn_comm_t c, int64_t *vals, int n, ra_reduce_op op)
{
    hub *h = c->impl;
    RA_CHECK(n >= 0 && n <= RA_ALLREDUCE_MAX, RINGATTN_ERR_INTERNAL,
             "ringattn comm threads: allreduce of %d values, expected <= %d", n, RA_ALLREDUCE_MAX);
    const struct timespec until = deadline();
    pthread_mutex_lock(&h->mu);
    if (h->failed) {
        const ringattn_status_t st = hub_failed(c, h);
        pthread_mutex_unlock(&h->mu);
        return st;
    }
    if (h->arrived == 0) memcpy(h->acc, vals, (size_t)n * sizeof *vals);
    else combine(h->acc, vals, n, op);
    if (h->arrived + 1 == h->size) memcpy(h->result, h->acc, (size_t)n * sizeof *vals);
    const ringattn_status_t st = barrier_locked(c, h, until, "allreduce");
    if (st == RINGATTN_SUCCESS) memcpy(vals, h->result, (size_t)n * sizeof *vals);
    pthread_mutex_unlock(&h->mu);
    return st;
}

/* Every rank publishes its buffer; all copy every buffer; nobody leaves (and frees its
   buffer) before all have copied. */
static ringattn_status_t th_allgather(ringattn_comm_t c, const void *send, void *recv,
                                      const size_t *bytes)
{
    hub *h = c->impl;
    const struct timespec until = deadline();
    pthread_mutex_lock(&h->mu);
    h->gather_src[c->rank] = send;
    ringattn_status_t st = barrier_locked(c, h, until, "allgather");
    pthread_mutex_unlock(&h->mu);
    if (st != RINGATTN_SUCCESS) return st;
    size_t at = 0;
    for (int r = 0; r < c->size; ++r) {
        if (bytes[r]) memcpy((char *)recv + at, h->gather_src[r], bytes[r]);
        at += bytes[r];
    }
    pthread_mutex_lock(&h->mu);
    st = barrier_locked(c, h, until, "allgather");
    pthread_mutex_unlock(&h->mu);
    return st;
}

static void th_notify_failure(ringattn_comm_t c)
{
    hub *h = c->impl;
    pthread_mutex_lock(&h->mu);
    if (!h->failed) {
        h->failed = 1;
        snprintf(h->reason, sizeof h->reason, "rank %d failed the comm: %.300s", c->rank,
                 c->reason);
    }
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static int th_peer_failed(ringattn_comm_t c)
{
    hub *h = c->impl;
    pthread_mutex_lock(&h->mu);
    const int failed = h->failed;
    if (failed) snprintf(c->reason, sizeof c->reason, "%s", h->reason);
    pthread_mutex_unlock(&h->mu);
    return failed;
}

/* A computing rank is progress for every waiting one (their deadlines count from it). */
static void th_beat(ringattn_comm_t c)
{
    hub *h = c->impl;
    pthread_mutex_lock(&h->mu);
    ++h->moves;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* Nothing outlives a wait here: a given-up exchange's posts are withdrawn under the lock. */
static int th_still_active(ringattn_comm_t c)
{
    (void)c;
    return 0;
}

static void hub_free(hub *h)
{
    if (!h) return;
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h->ranks);
    free(h->gather_src);
    free(h);
}

static void th_destroy(ringattn_comm_t c)
{
    hub *h = c->impl;
    if (h->dev) ra__threads_device_free(h, c->rank);
    pthread_mutex_lock(&h->mu);
    const int last = --h->refs == 0;
    pthread_mutex_unlock(&h->mu);
    if (last) hub_free(h);
    free(c);
}

static const struct ra_comm_ops threads_ops = {
    .name = "threads",
    .allreduce_i64 = th_allreduce,
    .allgather = th_allgather,
    .exchange_start = th_start,
    .exchange_test = th_test,
    .exchange_wait = th_wait,
    .notify_failure = th_notify_failure,
    .peer_failed = th_peer_failed,
    .still_active = th_still_active,
    .beat = th_beat,
    .destroy = th_destroy,
    .split_grid = ra__threads_split_grid,
};

/* The hub and num_ranks comms on it; with dev, a device comm on `device` (-1: the current). */
ringattn_status_t ra__comm_create_threads(const char *fn, int num_ranks, const ra_memory_ops *dev,
                                          int device, ringattn_comm_t *comms)
{
    RA_CHECK(comms != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: comms: got NULL, expected an array of num_ranks handles", fn);
    RA_CHECK(num_ranks >= 1 && num_ranks <= 4096, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: num_ranks: got %d, expected 1..4096", fn, num_ranks);
    hub *h = calloc(1, sizeof *h);
    ringattn_comm_t *made = calloc((size_t)num_ranks, sizeof *made);
    int ok = h && made && (h->gather_src = calloc((size_t)num_ranks, sizeof *h->gather_src));
    if (ok && dev) ok = (h->ranks = calloc((size_t)num_ranks, sizeof *h->ranks)) != NULL;
    for (int r = 0; ok && r < num_ranks; ++r) ok = (made[r] = calloc(1, sizeof *made[r])) != NULL;
    ringattn_status_t st = ok ? RINGATTN_SUCCESS
                              : ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (h) {
        pthread_mutex_init(&h->mu, NULL);
        pthread_cond_init(&h->cv, NULL);
        h->size = h->refs = num_ranks;
        h->dev = dev;
        h->device = device;
    }
    if (st == RINGATTN_SUCCESS && dev) st = ra__threads_device_make(h);
    for (int r = 0; st == RINGATTN_SUCCESS && r < num_ranks; ++r)
        if (ra__registry_add(made[r]) != 0)
            st = ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (st != RINGATTN_SUCCESS) {
        for (int r = 0; dev && h && h->ranks && r < num_ranks; ++r) ra__threads_device_free(h, r);
        for (int r = 0; made && r < num_ranks; ++r) {
            ra__registry_remove(made[r]);
            free(made[r]);
        }
        free(made);
        hub_free(h);
        return st;
    }
    for (int r = 0; r < num_ranks; ++r) {
        *made[r] = (struct ringattn_comm){.ops = &threads_ops, .rank = r, .size = num_ranks,
                                          .impl = h, .on_device = dev != NULL,
                                          .device = h->device};
        comms[r] = made[r];
    }
    free(made);
    return RINGATTN_SUCCESS;
}
