/*
 * What every transport shares -- destruction, the call agreement, tags, deadlines and the failed
 * state (comm.h, DESIGN: failure semantics).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "base/call_stream.h"
#include "base/log.h"
#include "base/registry.h"
#include "comm/comm.h"

/*
 * Collective calls this process refused before they reached a comm, ever (ra__comm_refused). A
 * NULL or destroyed plan, or an invalid comm, names no comm, so the count is the process's, not
 * a thread's: a rank's calls may run on any thread (PyTorch runs the backward on its own).
 */
static _Atomic unsigned long refused_calls;

int ra__comm_destroy(ringattn_comm_t comm)
{
    if (!comm || !ra__registry_remove(comm)) return 0;
    comm->ops->destroy(comm);
    return 1;
}

double ra__comm_timeout_s(void)
{
    const char *env = getenv("RINGATTN_COMM_TIMEOUT");
    const double s = env ? atof(env) : 0.0;
    return s > 0 ? s : 60.0;
}

double ra__comm_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int ra__comm_next_tag(ringattn_comm_t c)
{
    /* 31 calls x 512 exchanges x 2 slots: tags 0 .. 31743, below RA_COMM_TAG_FAILURE */
    const unsigned at = c->exchanges++ % 512u;
    return (int)(((c->calls % 31u) << 10) | (at * RA_EXCHANGE_SLOTS));
}

void ra__comm_refused(void) { atomic_fetch_add(&refused_calls, 1); }

static void beacon(void *ctx)
{
    ringattn_comm_t c = ctx;
    const double now = ra__comm_now();
    if (c->failed || now - c->last_beat < ra__comm_timeout_s() / 4) return;
    c->last_beat = now;
    c->ops->beat(c);
}

void ra__comm_beat_companion(ringattn_comm_t c)
{
    if (c->companion) beacon(c->companion);
}

void ra__comm_beacon_attach(ringattn_comm_t c, void *stream)
{
    if (stream) (void)ra__call_stream_attach(stream, beacon, c); /* full: no beacon, no harm */
}

void ra__comm_beacon_detach(ringattn_comm_t c, void *stream)
{
    if (stream) ra__call_stream_detach(stream, c);
}

#define RECREATE "destroy its plans and the comm, then create a new comm on every rank"

ringattn_status_t ra__comm_fail(ringattn_comm_t c, ringattn_status_t st)
{
    char msg[RA_COMM_REASON_BYTES];
    strncpy(msg, ra__last_error(), sizeof msg - 1);
    msg[sizeof msg - 1] = '\0';
    if (!c->failed) {
        c->failed = 1;
        memcpy(c->reason, msg, sizeof msg);
        c->ops->notify_failure(c);
    }
    return ra__fail(st, "%s; the comm has failed: " RECREATE, msg);
}

/* A failed comm fails every call at once, the same on every rank. */
static ringattn_status_t check_alive(ringattn_comm_t c, const char *fn)
{
    if (!c->failed && c->ops->peer_failed(c)) {
        c->failed = 1;
        c->ops->notify_failure(c); /* no rank may miss it, whoever told us */
    }
    RA_CHECK(!c->failed, RINGATTN_ERR_COMM, "%s: the comm failed earlier (%s); " RECREATE, fn,
             c->reason);
    return RINGATTN_SUCCESS;
}

/* The transport's message of a failure, with what the call was doing in front of it. */
static ringattn_status_t fail_in(ringattn_comm_t c, ringattn_status_t st, const char *fn,
                                 const char *what)
{
    char msg[RA_COMM_REASON_BYTES];
    strncpy(msg, ra__last_error(), sizeof msg - 1);
    msg[sizeof msg - 1] = '\0';
    return ra__comm_fail(c, ra__fail(st, "%s: %s: %s", fn, what, msg));
}

static ringattn_status_t allreduce(ringattn_comm_t c, const char *fn, int64_t *v, int n)
{
    RA_TRY(check_alive(c, fn));
    const ringattn_status_t st = c->ops->allreduce_i64(c, v, n, RA_REDUCE_MIN);
    return st == RINGATTN_SUCCESS ? st : fail_in(c, st, fn, "the call's agreement");
}

/* A rank's status as a MIN-reducible code: the lowest failing rank wins, with its status. */
static int64_t fail_code(const ringattn_comm_t c, ringattn_status_t st)
{
    return st == RINGATTN_SUCCESS ? INT64_MAX : (int64_t)c->rank * 16 + (int64_t)st;
}

/* what: "refused" (the opening agreement) or "failed" (the closing one). */
static ringattn_status_t failed_elsewhere(ringattn_comm_t c, const char *fn, int64_t code,
                                          const char *what)
{
    return ra__fail((ringattn_status_t)(code % 16),
                    "%s: %s on rank %d (this is rank %d of %d): see that rank's message; the "
                    "call failed on every rank",
                    fn, what, (int)(code / 16), c->rank, c->size);
}

static const char *kind_name(int64_t k)
{
    return k == RA_CALL_PLAN_CREATE ? "ringattn_plan_create"
           : k == RA_CALL_FORWARD   ? "ringattn_forward"
                                    : "ringattn_backward";
}

enum { HEAD = 8, VALS_MAX = RA_ALLREDUCE_MAX - HEAD };

static ringattn_status_t refused_before(ringattn_comm_t c, const char *fn, int64_t rank)
{
    return ra__fail(RINGATTN_ERR_INVALID_USAGE,
                    "%s: the process of rank %lld refused a call before it reached a comm (a "
                    "NULL or destroyed plan, or an invalid comm), which names no comm: so that "
                    "no call pairs with that one's peers, this call failed on every rank (this "
                    "is rank %d of %d), as does the next call of every comm of that process; "
                    "the call after pairs up again",
                    fn, (long long)rank, c->rank, c->size);
}

ringattn_status_t ra__comm_agree(ringattn_comm_t c, const char *fn, ra_call_kind kind,
                                 unsigned plan, ringattn_status_t local, int64_t *vals, int n)
{
    RA_CHECK(n >= 0 && n <= VALS_MAX, RINGATTN_ERR_INTERNAL, "%s: agreement of %d values", fn, n);
    /*
     * The process's refusals since this comm's last agreement ended (none before its first: no
     * plan of it existed then, and a plan_create retried after an invalid comm pairs rightly
     * with the others'). Each one adds to the call number, so that a rank that left a call
     * early does not pair its next call with its peers' current one, and fails this call on
     * every rank: with ranks as threads of one process, a peer that had not yet entered the
     * refused call counts the refusal too and would pair with the refusing rank's next call.
     * Refusals made while this agreement waits are dropped at its end: a peer of the refusing
     * rank then fails this call by the call numbers, and an unrelated comm needs nothing.
     */
    const unsigned long refused = atomic_load(&refused_calls);
    const unsigned long pending = c->agreed && !c->refusals_elsewhere ? refused - c->refused_seen
                                                                      : 0;
    const int64_t call = (int64_t)c->calls + 1 + (int64_t)pending;
    c->agreed = 1;
    c->calls = (unsigned)call;
    c->exchanges = 0;
    c->call_fn = fn;
    int64_t v[RA_ALLREDUCE_MAX] = {fail_code(c, local), call, -call, kind, -(int64_t)kind,
                                   plan, -(int64_t)plan, pending ? c->rank : INT64_MAX};
    for (int i = 0; i < n; ++i) v[HEAD + i] = local == RINGATTN_SUCCESS ? vals[i] : INT64_MAX;
    const ringattn_status_t st = allreduce(c, fn, v, HEAD + n);
    c->refused_seen = atomic_load(&refused_calls);
    RA_TRY(st);
    if (-v[2] != v[1]) c->calls = (unsigned)-v[2]; /* every rank resumes after the highest */
    if (local != RINGATTN_SUCCESS) return local; /* this rank's own message stands */
    RA_CHECK(-v[2] == v[1], RINGATTN_ERR_INVALID_USAGE,
             "%s: call %lld on this rank (rank %d of %d), calls %lld to %lld on the ranks: a "
             "rank left an earlier call before reaching the ring (a NULL or destroyed plan) or "
             "skipped one; the call failed on every rank, and the next call pairs up again",
             fn, (long long)call, c->rank, c->size, (long long)v[1], (long long)-v[2]);
    RA_CHECK(-v[4] == v[3], RINGATTN_ERR_INVALID_USAGE,
             "%s: other ranks are in %s (this is rank %d of %d), expected the same call on "
             "every rank; the call failed on every rank",
             fn, kind_name(v[3] == kind ? -v[4] : v[3]), c->rank, c->size);
    RA_CHECK(-v[6] == v[5], RINGATTN_ERR_INVALID_USAGE,
             "%s: other ranks passed another plan (this is rank %d of %d), expected the plans "
             "made together by one ringattn_plan_create; the call failed on every rank",
             fn, c->rank, c->size);
    if (v[0] != INT64_MAX) return failed_elsewhere(c, fn, v[0], "refused");
    if (v[7] != INT64_MAX) return refused_before(c, fn, v[7]);
    for (int i = 0; i < n; ++i) vals[i] = v[HEAD + i];
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__comm_conclude(ringattn_comm_t c, const char *fn, ringattn_status_t local)
{
    /* a failed comm has told every peer already: they fail their call on their own */
    if (c->failed) return local != RINGATTN_SUCCESS ? local : check_alive(c, fn);
    int64_t v[1] = {fail_code(c, local)};
    RA_TRY(allreduce(c, fn, v, 1));
    if (local != RINGATTN_SUCCESS) return local;
    return v[0] == INT64_MAX ? RINGATTN_SUCCESS : failed_elsewhere(c, fn, v[0], "failed");
}

ringattn_status_t ra__comm_check_stream(ringattn_comm_t c, const char *fn, void *stream)
{
    return c->ops->check_stream ? c->ops->check_stream(c, fn, stream) : RINGATTN_SUCCESS;
}

ringattn_status_t ra__comm_allgather(ringattn_comm_t c, const void *send, void *recv,
                                     const size_t *bytes)
{
    RA_TRY(check_alive(c, "ringattn comm"));
    const ringattn_status_t st = c->ops->allgather(c, send, recv, bytes);
    return st == RINGATTN_SUCCESS ? st : ra__comm_fail(c, st);
}

ringattn_status_t ra__comm_start(ringattn_comm_t c, ra_exchange *x, void *stream)
{
    RA_TRY(check_alive(c, "ringattn comm"));
    x->call = c->calls;
    const ringattn_status_t st = c->ops->exchange_start(c, x, stream);
    return st == RINGATTN_SUCCESS ? st : ra__comm_fail(c, st);
}

ringattn_status_t ra__comm_alltoall_op(ringattn_comm_t c, const ra_msg *send, const ra_msg *recv)
{
    RA_TRY(check_alive(c, "ringattn comm"));
    const ringattn_status_t st = c->ops->alltoall(c, send, recv);
    return st == RINGATTN_SUCCESS ? st : ra__comm_fail(c, st);
}

ringattn_status_t ra__comm_wait(ringattn_comm_t c, ra_exchange *x)
{
    const ringattn_status_t st = c->ops->exchange_wait(c, x);
    if (st == RINGATTN_SUCCESS) return st;
    char msg[RA_COMM_REASON_BYTES];
    strncpy(msg, ra__last_error(), sizeof msg - 1);
    msg[sizeof msg - 1] = '\0';
    return ra__comm_fail(c, ra__fail(st, "%s: %s (rank %d: ring step %d of call %u)",
                                     c->call_fn ? c->call_fn : "ringattn",
                                     msg, c->rank, x->step, x->call));
}

/* The checks every transport would repeat; the split itself is the transport's (comm.h). Each
   rank's outcome is its own (one may run out of memory): the caller concludes over c. */
ringattn_status_t ra__comm_split_grid(ringattn_comm_t c, const char *fn, int group,
                                      ringattn_comm_t out[2])
{
    RA_TRY(check_alive(c, fn));
    RA_CHECK(c->ops->split_grid != NULL, RINGATTN_ERR_UNSUPPORTED,
             "%s: the %s transport cannot split a comm: pass the group and ring comms to "
             "ringattn_plan_create_2d",
             fn, c->ops->name);
    RA_CHECK(group >= 1 && c->size % group == 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: group: got %d, expected a divisor of the comm's %d ranks", fn, group, c->size);
    ringattn_comm_t made[2] = {NULL, NULL};
    const ringattn_status_t st = c->ops->split_grid(c, group, made);
    if (st != RINGATTN_SUCCESS) /* what the transport made before it failed goes */
        for (int i = 0; i < 2; ++i) ra__comm_destroy(made[i]);
    /* a transport error (a peer's failure, the deadline) is the comm's, as in any collective */
    if (st == RINGATTN_ERR_COMM) return fail_in(c, st, fn, "splitting the comm");
    RA_TRY(st);
    out[0] = made[0];
    out[1] = made[1];
    return RINGATTN_SUCCESS;
}

int ra__comm_buffers_free_to_go(ringattn_comm_t c, int pinned, const char *what, size_t bytes,
                                int rank, int ranks)
{
    if (!pinned) return 1;
    if (ra__registry_contains(c) && c->ops->still_active(c) == 0) return 1;
    ra__log(RA_LOG_WARN, RA_SUB_COMM, rank, ranks,
            "ringattn_plan_destroy: the transport may still use %s after a failure; %zu bytes "
            "stay allocated", what, bytes);
    return 0;
}
