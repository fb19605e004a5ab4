/*
 * The custom transport (include/ringattn_transport.h): the caller's callbacks carry the bytes.
 * The control plane's allreduce is the caller's own; the allgather and the data plane are
 * batches of sendrecv_start, tested and waited for here against the deadline.
 *
 * Tags. An exchange's slot i is a batch of its own on the exchange's tag + i (ra__comm_next_tag),
 * each message at index 0: sender and receiver then name the same tag for slot i whether or not
 * the other slot is empty (one batch of the non-empty slots would shift slot 1 to index 0 on one
 * side only). The allgather takes one exchange's tag of the call from the same counter, so it
 * never meets a data-plane message, and posts one batch per peer (a send and a receive at index
 * 0): every (source, destination) pair carries one message of it, so one tag serves any size.
 *
 * Failures (comm.h). There is no callback to tell the peers, so notify_failure and peer_failed do
 * nothing and a failure reaches the peers through their deadlines; without partial progress to
 * watch, a wait's deadline counts from its start. A request given up (deadline, error) is kept
 * in impl->orphans and counted in c->active: still_active tests it until the transport says it
 * is done, so that no plan frees buffers under it.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/call_stream.h"
#include "base/log.h"
#include "base/registry.h"
#include "comm/comm.h"
#include "ringattn_transport.h"

_Static_assert((int)RA_REDUCE_MIN == (int)RINGATTN_REDUCE_MIN &&
                   (int)RA_REDUCE_MAX == (int)RINGATTN_REDUCE_MAX &&
                   (int)RA_REDUCE_SUM == (int)RINGATTN_REDUCE_SUM,
               "the public reduce ops are the transport table's");

/* A wait for a request blocks at most this long before the next request's turn (and the
   deadline's check). */
#define SLICE_S 0.01

typedef struct request {
    void *handle;
    int peer; /* the rank it waits for first: its receive's, else its send's */
    int live; /* posted and not yet done, nor given up */
} request;

typedef struct custom_impl {
    ringattn_transport_t t;
    void **orphans; /* requests given up, still the library's to test (c->active) */
    int num_orphans, cap_orphans;
    int lost;        /* given up and could not be kept: active for good */
    request *gather; /* [size] the allgather's requests, one per peer */
    ringattn_transport_msg_t *a2a; /* [2 size] an all-to-all's sends, then its receives */
} custom_impl;

/* The first callback that failed on a set of requests, and its code. */
typedef struct failure {
    const char *what;
    int code, peer;
} failure;

/* An exchange's state, in its impl bytes: one request per slot. */
typedef struct exchange_state {
    request req[RA_EXCHANGE_SLOTS];
    failure fail; /* a failed test from a kernel's poll, reported by the wait */
} exchange_state;

_Static_assert(sizeof(exchange_state) <= RA_EXCHANGE_IMPL_BYTES,
               "an exchange's custom state fits its impl bytes");
static exchange_state *state_of(ra_exchange *x) { return (exchange_state *)(void *)x->impl; }

static ringattn_status_t callback_error(ringattn_comm_t c, const failure *f)
{
    if (f->peer < 0) /* the control plane's allreduce */
        return ra__fail(RINGATTN_ERR_COMM, "ringattn comm custom: rank %d: the transport's %s "
                        "returned %d", c->rank, f->what, f->code);
    return ra__fail(RINGATTN_ERR_COMM,
                    "ringattn comm custom: rank %d: the transport's %s returned %d (a batch with "
                    "rank %d)",
                    c->rank, f->what, f->code, f->peer);
}

/* Keeps a live request given up: still_active tests it until it is done. */
static void orphan(ringattn_comm_t c, request *r)
{
    custom_impl *impl = c->impl;
    if (!r->live) return;
    r->live = 0;
    ++c->active;
    if (impl->num_orphans == impl->cap_orphans) {
        const int cap = impl->cap_orphans ? 2 * impl->cap_orphans : 8;
        void **grown = realloc(impl->orphans, (size_t)cap * sizeof *grown);
        if (!grown) { /* never tested again: it stays active for good */
            ++impl->lost;
            return;
        }
        impl->orphans = grown;
        impl->cap_orphans = cap;
    }
    impl->orphans[impl->num_orphans++] = r->handle;
}

static void give_up(ringattn_comm_t c, request *reqs, int n)
{
    for (int i = 0; i < n; ++i) orphan(c, &reqs[i]);
}

/* One test (slice < 0) or wait of a live request. A request done is no longer live; one whose
   callback failed is given up; the first failure goes into *f. */
static void progress(ringattn_comm_t c, request *r, double slice, failure *f)
{
    const ringattn_transport_t *t = &((custom_impl *)c->impl)->t;
    int done = 0;
    const int rc = slice < 0 ? t->test(t->user, r->handle, &done)
                             : t->wait(t->user, r->handle, slice, &done);
    if (done) r->live = 0;
    if (rc == 0) return;
    if (!f->what) *f = (failure){slice < 0 ? "test" : "wait", rc, r->peer};
    orphan(c, r);
}

/* Posts one batch (a send and a receive at most) as request r. */
static ringattn_status_t post(ringattn_comm_t c, const ra_msg *send, const ra_msg *recv, int tag,
                              request *r)
{
    const ringattn_transport_t *t = &((custom_impl *)c->impl)->t;
    const ringattn_transport_msg_t s = {send->buf, send->bytes, send->peer};
    const ringattn_transport_msg_t v = {recv->buf, recv->bytes, recv->peer};
    const int ns = send->bytes > 0, nr = recv->bytes > 0;
    r->live = 0;
    if (!ns && !nr) return RINGATTN_SUCCESS;
    r->peer = nr ? recv->peer : send->peer;
    void *handle = NULL;
    const int rc = t->sendrecv_start(t->user, ns ? &s : NULL, ns, nr ? &v : NULL, nr, tag, &handle);
    if (rc != 0) return callback_error(c, &(failure){"sendrecv_start", rc, r->peer});
    *r = (request){handle, r->peer, 1};
    return RINGATTN_SUCCESS;
}

/* Waits for n requests, in slices round robin, until all are done, a callback fails or the
   deadline passes since the start; then what is still live is given up. */
static ringattn_status_t wait_all(ringattn_comm_t c, request *reqs, int n, failure *f,
                                  const char *what)
{
    const double limit = ra__comm_timeout_s(), start = ra__comm_now();
    for (;;) {
        int live = 0, peer = -1;
        for (int i = 0; i < n && !f->what; ++i) {
            if (!reqs[i].live) continue;
            const double left = limit - (ra__comm_now() - start);
            progress(c, &reqs[i], left < SLICE_S ? (left > 0 ? left : 0) : SLICE_S, f);
            if (reqs[i].live && !live++) peer = reqs[i].peer;
        }
        if (f->what) {
            give_up(c, reqs, n);
            return callback_error(c, f);
        }
        if (!live) return RINGATTN_SUCCESS;
        if (ra__comm_now() - start > limit) {
            give_up(c, reqs, n);
            return ra__fail(RINGATTN_ERR_COMM,
                            "ringattn comm custom: rank %d: %s: no answer from rank %d for %g s",
                            c->rank, what, peer, limit);
        }
    }
}

static ringattn_status_t cu_allreduce(ringattn_comm_t c, int64_t *vals, int n, ra_reduce_op op)
{
    const ringattn_transport_t *t = &((custom_impl *)c->impl)->t;
    RA_CHECK(n >= 0 && n <= RA_ALLREDUCE_MAX, RINGATTN_ERR_INTERNAL,
             "ringattn comm custom: allreduce of %d values, expected <= %d", n, RA_ALLREDUCE_MAX);
    const int rc = t->allreduce(t->user, vals, n, (ringattn_reduce_op_t)op);
    return rc == 0 ? RINGATTN_SUCCESS : callback_error(c, &(failure){"allreduce", rc, -1});
}

/* Rank r's bytes go to every peer directly, one batch per peer (see the top). */
static ringattn_status_t cu_allgather(ringattn_comm_t c, const void *send, void *recv,
                                      const size_t *bytes)
{
    custom_impl *impl = c->impl;
    const int tag = ra__comm_next_tag(c);
    const ra_msg none = {NULL, 0, 0};
    size_t at = 0;
    for (int q = 0; q < c->size; ++q) {
        char *into = (char *)recv + at;
        at += bytes[q];
        impl->gather[q].live = 0;
        if (q == c->rank) {
            if (bytes[q]) memmove(into, send, bytes[q]);
            continue;
        }
        const ra_msg out = {(void *)send, bytes[c->rank], q}, in = {into, bytes[q], q};
        const ringattn_status_t st =
            post(c, bytes[c->rank] ? &out : &none, bytes[q] ? &in : &none, tag, &impl->gather[q]);
        if (st != RINGATTN_SUCCESS) {
            give_up(c, impl->gather, q);
            return st;
        }
    }
    failure f = {NULL, 0, -1};
    return wait_all(c, impl->gather, c->size, &f, "allgather");
}

static void poll_exchange(void *ctx)
{
    ra_exchange *x = ctx;
    exchange_state *s = state_of(x);
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i)
        if (s->req[i].live) progress(x->comm, &s->req[i], -1.0, &s->fail);
}

static ringattn_status_t cu_start(ringattn_comm_t c, ra_exchange *x, void *stream)
{
    exchange_state *s = state_of(x);
    x->comm = c;
    x->tag = ra__comm_next_tag(c);
    x->stream = NULL;
    s->fail = (failure){NULL, 0, -1};
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i) s->req[i].live = 0;
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i) {
        const ringattn_status_t st = post(c, &x->send[i], &x->recv[i], x->tag + i, &s->req[i]);
        if (st != RINGATTN_SUCCESS) { /* no wait follows a failed start */
            give_up(c, s->req, RA_EXCHANGE_SLOTS);
            return st;
        }
    }
    if (stream && ra__call_stream_attach(stream, poll_exchange, x) == 0) x->stream = stream;
    return RINGATTN_SUCCESS;
}

static ringattn_status_t cu_test(ringattn_comm_t c, ra_exchange *x, int *done)
{
    exchange_state *s = state_of(x);
    poll_exchange(x);
    *done = 1;
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i) *done = *done && !s->req[i].live;
    return s->fail.what ? callback_error(c, &s->fail) : RINGATTN_SUCCESS;
}

static ringattn_status_t cu_wait(ringattn_comm_t c, ra_exchange *x)
{
    if (x->stream) ra__call_stream_detach(x->stream, x);
    x->stream = NULL;
    exchange_state *s = state_of(x);
    return wait_all(c, s->req, RA_EXCHANGE_SLOTS, &s->fail, "exchange");
}

/* The transport's alltoall_start (ringattn_transport.h, since 0.6): one request, waited for as
   an exchange's. */
static ringattn_status_t cu_alltoall(ringattn_comm_t c, const ra_msg *send, const ra_msg *recv)
{
    custom_impl *impl = c->impl;
    ringattn_transport_msg_t *s = impl->a2a, *v = impl->a2a + c->size;
    request r = {NULL, -1, 0};
    for (int q = 0; q < c->size; ++q) {
        const int mine = q == c->rank;
        s[q] = (ringattn_transport_msg_t){send[q].buf, mine ? 0 : send[q].bytes, q};
        v[q] = (ringattn_transport_msg_t){recv[q].buf, mine ? 0 : recv[q].bytes, q};
        if (v[q].bytes && r.peer < 0) r.peer = q;
    }
    const int rc = impl->t.alltoall_start(impl->t.user, s, v, ra__comm_next_tag(c), &r.handle);
    if (rc != 0) return callback_error(c, &(failure){"alltoall_start", rc, r.peer});
    r.live = 1;
    failure f = {NULL, 0, -1};
    return wait_all(c, &r, 1, &f, "all-to-all");
}

/* No callback reaches the peers: they fail at their deadlines (see the top). */
static void cu_notify_failure(ringattn_comm_t c) { (void)c; }
static int cu_peer_failed(ringattn_comm_t c)
{
    (void)c;
    return 0;
}
static void cu_beat(ringattn_comm_t c) { (void)c; }

/* Tests the requests given up; those done are the transport's again. */
static int cu_still_active(ringattn_comm_t c)
{
    custom_impl *impl = c->impl;
    for (int i = 0; i < impl->num_orphans;) {
        int done = 0;
        (void)impl->t.test(impl->t.user, impl->orphans[i], &done); /* *done counts, not the code */
        if (done) impl->orphans[i] = impl->orphans[--impl->num_orphans];
        else ++i;
    }
    c->active = impl->num_orphans + impl->lost;
    return c->active;
}

static void cu_destroy(ringattn_comm_t c)
{
    custom_impl *impl = c->impl;
    const int running = cu_still_active(c);
    if (running)
        ra__log(RA_LOG_WARN, RA_SUB_COMM, c->rank, c->size,
                "comm custom: destroyed with %d requests the library gave up still running; the "
                "transport's release ends them",
                running);
    if (impl->t.release) impl->t.release(impl->t.user);
    free(impl->orphans);
    free(impl->gather);
    free(impl->a2a);
    free(impl);
    free(c);
}

/* The table, with the transport's own all-to-all where it has one (else rounds of batches). */
#define CUSTOM_OPS(all_to_all)                                                                  \
    {                                                                                           \
        .name = "custom", .allreduce_i64 = cu_allreduce, .allgather = cu_allgather,            \
        .exchange_start = cu_start, .exchange_test = cu_test, .exchange_wait = cu_wait,        \
        .notify_failure = cu_notify_failure, .peer_failed = cu_peer_failed,                     \
        .still_active = cu_still_active, .beat = cu_beat, .destroy = cu_destroy,                \
        .alltoall = all_to_all                                                                  \
    }
static const struct ra_comm_ops custom_ops = CUSTOM_OPS(NULL);
static const struct ra_comm_ops custom_ops_alltoall = CUSTOM_OPS(cu_alltoall);

ringattn_status_t ra__comm_create_custom(const char *fn, const ringattn_transport_t *transport,
                                         int rank, int size, ringattn_comm_t *comm)
{
    struct ringattn_comm *c = calloc(1, sizeof *c);
    custom_impl *impl = calloc(1, sizeof *impl);
    request *gather = impl ? calloc((size_t)size, sizeof *gather) : NULL;
    ringattn_transport_msg_t *a2a = impl ? calloc(2 * (size_t)size, sizeof *a2a) : NULL;
    if (!c || !impl || !gather || !a2a || ra__registry_add(c) != 0) {
        free(c);
        free(impl);
        free(gather);
        free(a2a);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    impl->t = *transport;
    impl->gather = gather;
    impl->a2a = a2a;
    *c = (struct ringattn_comm){.ops = transport->alltoall_start ? &custom_ops_alltoall
                                                                 : &custom_ops,
                                .rank = rank, .size = size, .impl = impl, .device = -1};
    *comm = c;
    return RINGATTN_SUCCESS;
}
