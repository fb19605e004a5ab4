/*
 * The NCCL transport (DESIGN: the NCCL transport): ring attention across GPUs on a NCCL
 * communicator, the caller's (borrowed: never destroyed, never aborted) or one ringattn made from
 * a unique id.
 *
 * Data plane, without a host wait: an exchange records `ready` on the call's stream (the data is
 * written, the receive buffers are no longer read), the transport's own stream (non-blocking,
 * highest priority) waits on it and runs the exchange as one ncclGroupStart/ncclSend/ncclRecv/
 * ncclGroupEnd, then records `done`, which the call's stream waits on at the exchange's wait.
 *
 * Control plane (the plan's and calls' agreements, the key bias): ncclAllReduce on a small
 * device buffer on the transport's stream, then the host polls its event against the deadline
 * (RINGATTN_COMM_TIMEOUT), with ncclCommGetAsyncError between polls. Every call ends with such an
 * agreement (ra__comm_conclude), which queues behind the call's exchanges on the same stream: a
 * peer that never sends, or a failed one, surfaces there as RINGATTN_ERR_COMM within the
 * deadline on every rank, never as a hang. A communicator ringattn made is then aborted; a
 * borrowed one is only marked failed here, and the message says so.
 */
#include <nccl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/memory_ops.h"
#include "base/error.h"
#include "base/call_stream.h"
#include "base/registry.h"
#include "comm/comm.h"
#include "comm/nccl_comm.h"
#include "comm/notice.h"

/*
 * Ranks of this process's NCCL comms per device. Real NCCL refuses two ranks of one
 * communicator on one GPU, but comms of several communicators, or the fake NCCL's ranks as
 * threads, can share one. Their calls must not share the legacy default stream: it is one FIFO
 * for the device, so a rank's exchange queued behind a peer's wait for that very exchange
 * deadlocks until the deadline (issue 28: calls failed after 3 s, some ranks' succeeded on data
 * their aborted peers never sent).
 */
#define RA_NCCL_DEVICES 256
static _Atomic int ranks_on_device[RA_NCCL_DEVICES];

static _Atomic int *device_count(int device)
{
    return device >= 0 && device < RA_NCCL_DEVICES ? &ranks_on_device[device] : NULL;
}

typedef struct nccl_impl {
    ncclComm_t nc;
    int owned; /* made by ringattn_comm_create_nccl_id: aborted on failure, destroyed with it */
    const ra_memory_ops *dev;
    void *stream, *ready, *done, *control_done;
    void *control;       /* device: RA_ALLREDUCE_MAX int64 for the agreements */
    void *gather;        /* device: the allgather's staging buffer, grown once to its largest */
    size_t gather_bytes;
    int aborted;
    /* the failure notice beside NCCL (comm/notice.h): the ranks' addresses are gathered at the
       comm's first agreement, the first collective every rank makes on it */
    ra_notice *notice;
    ra_notice_addr notice_self;
    int notice_ready;
} nccl_impl;

/* What a failure message adds about the communicator: a borrowed one is the caller's to abort. */
static const char *borrowed_hint(const nccl_impl *n)
{
    return n->owned ? "" : "; the caller's communicator is left as it is: abort it";
}

static ringattn_status_t nccl_fail(ringattn_comm_t c, const char *what, ncclResult_t r)
{
    const nccl_impl *n = c->impl;
    return ra__fail(RINGATTN_ERR_COMM, "ringattn comm nccl: rank %d: %s: %s (%s)%s", c->rank, what,
                    ncclGetErrorString(r), ncclGetLastError(n->nc), borrowed_hint(n));
}

ncclResult_t ra__nccl_settle(ncclComm_t nc, ncclResult_t r)
{
    const double until = ra__comm_now() + ra__comm_timeout_s();
    while (r == ncclInProgress && ra__comm_now() < until)
        if (ncclCommGetAsyncError(nc, &r) != ncclSuccess) r = ncclInternalError;
    return r;
}

/* A non-blocking communicator's call may return ncclInProgress: poll until it is done. */
static ringattn_status_t settle(ringattn_comm_t c, const char *what, ncclResult_t r)
{
    nccl_impl *n = c->impl;
    r = ra__nccl_settle(n->nc, r);
    if (r == ncclSuccess) return RINGATTN_SUCCESS;
    if (r == ncclInProgress)
        return ra__fail(RINGATTN_ERR_COMM, "ringattn comm nccl: rank %d: %s: still in progress "
                        "after %g s", c->rank, what, ra__comm_timeout_s());
    return nccl_fail(c, what, r);
}

/* Polls event until it has run, a peer's notice arrives, the communicator reports an error, or
   the deadline. */
static ringattn_status_t poll_event(ringattn_comm_t c, void *event, const char *what)
{
    nccl_impl *n = c->impl;
    const double until = ra__comm_now() + ra__comm_timeout_s();
    for (;;) {
        int done = 0;
        RA_TRY(n->dev->event_query(event, &done));
        if (done) return RINGATTN_SUCCESS;
        if (ra__notice_poll(n->notice, c->reason, sizeof c->reason))
            return ra__fail(RINGATTN_ERR_COMM, "ringattn comm nccl: rank %d: %s: %s", c->rank,
                            what, c->reason);
        ncclResult_t r = ncclSuccess;
        if (ncclCommGetAsyncError(n->nc, &r) == ncclSuccess && r != ncclSuccess && r != ncclInProgress)
            return nccl_fail(c, what, r);
        if (ra__comm_now() > until)
            return ra__fail(RINGATTN_ERR_COMM,
                            "ringattn comm nccl: rank %d: %s: not done after %g s (a peer that "
                            "never sends, or one that left the call)%s",
                            c->rank, what, ra__comm_timeout_s(), borrowed_hint(n));
    }
}

/* The control plane's round trip: every rank's `count` elements of buf (device) reduced in
   place on the transport's stream, waited for against the deadline, then `bytes` of it to host. */
static ringattn_status_t reduce_to_host(ringattn_comm_t c, void *buf, size_t count,
                                        ncclDataType_t type, ncclRedOp_t op, const char *what,
                                        void *host, size_t bytes)
{
    nccl_impl *n = c->impl;
    RA_TRY(settle(c, "ncclAllReduce", ncclAllReduce(buf, buf, count, type, op, n->nc, n->stream)));
    RA_TRY(n->dev->event_record(n->control_done, n->stream));
    RA_TRY(poll_event(c, n->control_done, what));
    return n->dev->copy_to_host(host, buf, bytes, n->stream);
}

/* n_vals int64 values of every rank reduced in place on the control buffer. */
static ringattn_status_t control_reduce(ringattn_comm_t c, int64_t *vals, int n_vals,
                                        ra_reduce_op op)
{
    nccl_impl *n = c->impl;
    RA_CHECK(n_vals >= 0 && n_vals <= RA_ALLREDUCE_MAX, RINGATTN_ERR_INTERNAL,
             "ringattn comm nccl: allreduce of %d values, expected <= %d", n_vals, RA_ALLREDUCE_MAX);
    const size_t bytes = (size_t)n_vals * sizeof *vals;
    const ncclRedOp_t nop = op == RA_REDUCE_SUM ? ncclSum : op == RA_REDUCE_MIN ? ncclMin : ncclMax;
    RA_TRY(n->dev->copy_from_host(n->control, vals, bytes, n->stream));
    return reduce_to_host(c, n->control, (size_t)n_vals, ncclInt64, nop, "agreement", vals, bytes);
}

/*
 * Every rank's notice address (comm/notice.h), once, before the comm's first agreement: sums
 * over the control buffer, RECORDS ranks' records at a time, each rank's bits in its place and
 * zeros elsewhere (x + 0 = x). No device memory is allocated or freed for it: with ranks that
 * share a device (the fake NCCL's threads), a cudaFree waits for the peers' queued work.
 */
static ringattn_status_t notice_gather(ringattn_comm_t c)
{
    enum { RECORDS = RA_ALLREDUCE_MAX * sizeof(int64_t) / sizeof(ra_notice_addr) };
    _Static_assert(sizeof(ra_notice_addr) % sizeof(int64_t) == 0, "whole int64 values");
    nccl_impl *n = c->impl;
    n->notice_ready = 1;
    ra_notice_addr *all = calloc((size_t)c->size, sizeof *all);
    RA_CHECK(all != NULL, RINGATTN_ERR_OUT_OF_MEMORY, "ringattn comm nccl: out of memory");
    ringattn_status_t st = RINGATTN_SUCCESS;
    for (int first = 0; st == RINGATTN_SUCCESS && first < c->size; first += RECORDS) {
        const int count = c->size - first < RECORDS ? c->size - first : RECORDS;
        int64_t vals[RA_ALLREDUCE_MAX] = {0};
        if (c->rank >= first && c->rank < first + count)
            memcpy((char *)vals + (size_t)(c->rank - first) * sizeof *all, &n->notice_self,
                   sizeof *all);
        st = control_reduce(c, vals, (int)(count * sizeof *all / sizeof *vals), RA_REDUCE_SUM);
        if (st == RINGATTN_SUCCESS) memcpy(all + first, vals, (size_t)count * sizeof *all);
    }
    if (st == RINGATTN_SUCCESS) ra__notice_connect(n->notice, all, c->size, c->rank);
    free(all);
    return st;
}

static ringattn_status_t nc_allreduce(ringattn_comm_t c, int64_t *vals, int n_vals, ra_reduce_op op)
{
    nccl_impl *n = c->impl;
    if (!n->notice_ready) RA_TRY(notice_gather(c));
    return control_reduce(c, vals, n_vals, op);
}

/* Every rank's bytes in one zeroed buffer at its place, summed as bytes: each place holds its
   owner's bytes exactly (x + 0 = x). */
static ringattn_status_t nc_allgather(ringattn_comm_t c, const void *send, void *recv,
                                      const size_t *bytes)
{
    nccl_impl *n = c->impl;
    size_t total = 0, at = 0;
    for (int r = 0; r < c->size; ++r) total += bytes[r], at += r < c->rank ? bytes[r] : 0;
    if (total == 0) return RINGATTN_SUCCESS;
    if (total > n->gather_bytes) {
        if (n->gather) n->dev->free(n->gather);
        n->gather = NULL, n->gather_bytes = 0;
        RA_TRY(n->dev->alloc(total, &n->gather));
        n->gather_bytes = total;
    }
    RA_TRY(n->dev->zero(n->gather, total, n->stream));
    if (bytes[c->rank])
        RA_TRY(n->dev->copy_from_host((char *)n->gather + at, send, bytes[c->rank], n->stream));
    return reduce_to_host(c, n->gather, total, ncclUint8, ncclSum, "allgather", recv, total);
}

static ringattn_status_t nc_start(ringattn_comm_t c, ra_exchange *x, void *stream)
{
    nccl_impl *n = c->impl;
    x->comm = c;
    x->tag = ra__comm_next_tag(c);
    x->stream = stream;
    RA_TRY(n->dev->event_record(n->ready, ra__call_stream_device(stream)));
    RA_TRY(n->dev->stream_wait(n->stream, n->ready));
    ncclResult_t r = ncclGroupStart();
    for (int i = 0; i < RA_EXCHANGE_SLOTS && r == ncclSuccess; ++i) {
        if (x->send[i].bytes)
            r = ncclSend(x->send[i].buf, x->send[i].bytes, ncclInt8, x->send[i].peer, n->nc, n->stream);
        if (r == ncclSuccess && x->recv[i].bytes)
            r = ncclRecv(x->recv[i].buf, x->recv[i].bytes, ncclInt8, x->recv[i].peer, n->nc, n->stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    RA_TRY(settle(c, "ncclSend/ncclRecv", r != ncclSuccess ? r : end));
    return n->dev->event_record(n->done, n->stream);
}

static ringattn_status_t nc_test(ringattn_comm_t c, ra_exchange *x, int *done)
{
    (void)x;
    nccl_impl *n = c->impl;
    return n->dev->event_query(n->done, done);
}

/* The call's stream waits for the exchange; the host does not (the call's closing agreement
   finds a stalled exchange, against the deadline). */
static ringattn_status_t nc_wait(ringattn_comm_t c, ra_exchange *x)
{
    nccl_impl *n = c->impl;
    return n->dev->stream_wait(ra__call_stream_device(x->stream), n->done);
}

static void nc_notify_failure(ringattn_comm_t c)
{
    nccl_impl *n = c->impl;
    ra__notice_send(n->notice, c->reason); /* within a node NCCL tells the peers nothing */
    if (n->owned && !n->aborted) { /* its peers' NCCL calls then fail too */
        ncclCommAbort(n->nc);
        n->aborted = 1;
    }
}

static int nc_peer_failed(ringattn_comm_t c)
{
    nccl_impl *n = c->impl;
    if (ra__notice_poll(n->notice, c->reason, sizeof c->reason)) return 1;
    ncclResult_t r = ncclSuccess;
    if (n->aborted || ncclCommGetAsyncError(n->nc, &r) != ncclSuccess || r == ncclSuccess ||
        r == ncclInProgress)
        return 0;
    snprintf(c->reason, sizeof c->reason, "NCCL reports: %s", ncclGetErrorString(r));
    return 1;
}

/* A failed, borrowed communicator may still run queued exchanges over the plan's buffers. */
static int nc_still_active(ringattn_comm_t c)
{
    nccl_impl *n = c->impl;
    int done = 1;
    if (!n->aborted && n->dev->event_query(n->done, &done) != RINGATTN_SUCCESS) return 1;
    c->active = !done;
    return c->active;
}

static void nc_beat(ringattn_comm_t c) { (void)c; } /* the host never waits on a computing peer */

static ringattn_status_t nc_check_stream(ringattn_comm_t c, const char *fn, void *stream)
{
    _Atomic int *count = device_count(c->device);
    const int ranks = count ? atomic_load(count) : 1;
    RA_CHECK(stream != NULL || ranks < 2, RINGATTN_ERR_UNSUPPORTED,
             "%s: stream: got NULL (the legacy default stream), but %d ranks of this process's "
             "NCCL comms are on device %d and would queue their exchanges behind each other's "
             "waits on that one stream; give each rank a stream of its own",
             fn, ranks, c->device);
    return RINGATTN_SUCCESS;
}

static void impl_free(nccl_impl *n)
{
    if (!n) return;
    if (n->dev) {
        if (n->control) n->dev->free(n->control);
        if (n->gather) n->dev->free(n->gather);
        void *ev[] = {n->ready, n->done, n->control_done};
        for (int i = 0; i < 3; ++i)
            if (ev[i]) n->dev->event_destroy(ev[i]);
        if (n->stream) n->dev->stream_destroy(n->stream);
    }
    if (n->owned && n->nc && !n->aborted) ncclCommDestroy(n->nc);
    ra__notice_close(n->notice);
    free(n);
}

static void nc_destroy(ringattn_comm_t c)
{
    nccl_impl *n = c->impl;
    const ra_memory_ops *dev = n->dev;
    const int previous = dev->set_device(c->device);
    _Atomic int *count = device_count(c->device);
    if (count) atomic_fetch_sub(count, 1);
    impl_free(n);
    if (previous >= 0) dev->set_device(previous);
    free(c);
}

/* ringattn's own communicators, split off this one (comm/nccl_join.c), borrowed or not. */
static ringattn_status_t nc_split_grid(ringattn_comm_t c, int group, ringattn_comm_t out[2])
{
    const nccl_impl *n = c->impl;
    return ra__nccl_split_grid(n->nc, c->rank, group, c->device, n->dev, out);
}

static const struct ra_comm_ops nccl_ops = {
    .name = "nccl",
    .allreduce_i64 = nc_allreduce,
    .allgather = nc_allgather,
    .exchange_start = nc_start,
    .exchange_test = nc_test,
    .exchange_wait = nc_wait,
    .notify_failure = nc_notify_failure,
    .peer_failed = nc_peer_failed,
    .still_active = nc_still_active,
    .beat = nc_beat,
    .check_stream = nc_check_stream,
    .destroy = nc_destroy,
    .split_grid = nc_split_grid,
};

ringattn_status_t ra__comm_create_nccl(const char *fn, ncclComm_t nc, int owned,
                                       const ra_memory_ops *dev, ringattn_comm_t *out)
{
    int rank = 0, size = 0, device = -1;
    RA_CHECK(ncclCommUserRank(nc, &rank) == ncclSuccess && ncclCommCount(nc, &size) == ncclSuccess &&
                 ncclCommCuDevice(nc, &device) == ncclSuccess,
             RINGATTN_ERR_INVALID_ARGUMENT, "%s: comm: NCCL does not know it as a communicator", fn);
    nccl_impl *n = calloc(1, sizeof *n);
    ringattn_comm_t c = calloc(1, sizeof *c);
    if (!n || !c) {
        free(n), free(c);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    *n = (nccl_impl){.nc = nc, .owned = owned, .dev = dev};
    n->notice = ra__notice_open(&n->notice_self); /* NULL: no notices, the deadlines remain */
    const int previous = dev->set_device(device);
    ringattn_status_t st = previous >= 0 ? RINGATTN_SUCCESS
                                         : ra__fail(RINGATTN_ERR_CUDA, "%s: device %d: cannot make "
                                                    "it current", fn, device);
    if (st == RINGATTN_SUCCESS) st = dev->stream_create(&n->stream);
    if (st == RINGATTN_SUCCESS) st = dev->event_create(&n->ready);
    if (st == RINGATTN_SUCCESS) st = dev->event_create(&n->done);
    if (st == RINGATTN_SUCCESS) st = dev->event_create(&n->control_done);
    if (st == RINGATTN_SUCCESS) st = dev->alloc(RA_ALLREDUCE_MAX * sizeof(int64_t), &n->control);
    if (st == RINGATTN_SUCCESS && ra__registry_add(c) != 0)
        st = ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    if (previous >= 0) dev->set_device(previous);
    if (st != RINGATTN_SUCCESS) {
        n->owned = 0; /* the caller keeps what it gave */
        impl_free(n);
        free(c);
        return st;
    }
    *c = (struct ringattn_comm){.ops = &nccl_ops, .rank = rank, .size = size, .impl = n,
                                .on_device = 1, .device = device};
    _Atomic int *count = device_count(device);
    if (count) atomic_fetch_add(count, 1);
    *out = c;
    return RINGATTN_SUCCESS;
}
