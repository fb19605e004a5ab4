/*
 * The MPI transport: a private duplicate of the caller's communicator, with MPI_ERRORS_RETURN
 * so that an MPI error is a status, never an abort. This file: the comm, the control plane
 * (non-blocking collectives polled against the deadline) and failures; the data plane is
 * comm/mpi_exchange.c. After a failure the comm keeps what MPI may still run (comm.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/log.h"
#include "base/registry.h"
#include "comm/mpi_impl.h"
#include "ringattn_mpi.h"

#define DEFAULT_CHUNK ((size_t)256 << 10)

ringattn_status_t ra__mpi_error(ringattn_comm_t c, const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "code %d", rc);
    return ra__fail(RINGATTN_ERR_COMM, "ringattn comm mpi: rank %d: %s: %s", c->rank, what, msg);
}

void ra__mpi_orphan(ringattn_comm_t c, MPI_Request *req)
{
    mpi_impl *impl = c->impl;
    ++c->active;
    if (impl->num_orphans == impl->cap_orphans) {
        const int cap = impl->cap_orphans ? 2 * impl->cap_orphans : 8;
        MPI_Request *grown = realloc(impl->orphans, (size_t)cap * sizeof *grown);
        if (!grown) { /* unknown end: it stays active for good */
            MPI_Request_free(req);
            return;
        }
        impl->orphans = grown;
        impl->cap_orphans = cap;
    }
    impl->orphans[impl->num_orphans++] = *req;
    *req = MPI_REQUEST_NULL;
}

/* A request has ended, or there is none (it is then MPI_REQUEST_NULL). */
static int test_done(MPI_Request *req)
{
    int flag = 1;
    if (*req != MPI_REQUEST_NULL) MPI_Test(req, &flag, MPI_STATUS_IGNORE);
    return flag;
}

/* Tests the kept requests; returns how many still run. */
static int mpi_still_active(ringattn_comm_t c)
{
    mpi_impl *impl = c->impl;
    int running = 0;
    for (int i = 0; i < impl->num_orphans; ++i) running += !test_done(&impl->orphans[i]);
    if (running == 0) impl->num_orphans = 0;
    const int lost = c->active - impl->num_orphans; /* freed unknown: never ends for us */
    c->active = running + (lost > 0 ? lost : 0);
    return c->active;
}

int ra__mpi_peer_failed(ringattn_comm_t c)
{
    mpi_impl *impl = c->impl;
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, RA_COMM_TAG_FAILURE, impl->comm, &flag, &st) != MPI_SUCCESS ||
        !flag)
        return 0;
    MPI_Recv(c->reason, (int)sizeof c->reason, MPI_CHAR, st.MPI_SOURCE, RA_COMM_TAG_FAILURE,
             impl->comm, MPI_STATUS_IGNORE);
    c->reason[sizeof c->reason - 1] = '\0';
    return 1;
}

/* Tells every peer, without waiting: their waits poll for the notice. */
static void mpi_notify_failure(ringattn_comm_t c)
{
    mpi_impl *impl = c->impl;
    snprintf(impl->notice, sizeof impl->notice, "rank %d failed the comm: %.320s", c->rank,
             c->reason);
    for (int r = 0; r < c->size; ++r)
        if (r != c->rank && impl->notices[r] == MPI_REQUEST_NULL)
            MPI_Isend(impl->notice, (int)sizeof impl->notice, MPI_CHAR, r, RA_COMM_TAG_FAILURE,
                      impl->comm, &impl->notices[r]);
}

/* A computing rank tells every peer (a peer may wait for it in a collective or an exchange). */
static void mpi_beat(ringattn_comm_t c)
{
    for (int r = 0; r < c->size; ++r)
        if (r != c->rank) ra__mpi_send_beat(c, r, 0.0);
}

/* Polls a collective until it completes, a peer fails or the deadline passes without progress
   (a heartbeat from any rank); then it is kept (MPI can neither cancel nor free a collective). */
static ringattn_status_t wait_collective(ringattn_comm_t c, MPI_Request *req, const char *what)
{
    const double limit = ra__comm_timeout_s();
    double last = ra__comm_now();
    for (;;) {
        int flag = 0;
        const int rc = MPI_Test(req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return ra__mpi_error(c, what, rc);
        if (flag) return RINGATTN_SUCCESS;
        if (ra__mpi_peer_failed(c)) {
            ra__mpi_orphan(c, req);
            return ra__fail(RINGATTN_ERR_COMM, "ringattn comm mpi: rank %d: %s: %s", c->rank,
                            what, c->reason);
        }
        const double now = ra__comm_now();
        ra__mpi_heard(c, NULL, NULL, now, &last);
        if (now - last > limit) {
            ra__mpi_orphan(c, req);
            return ra__fail(RINGATTN_ERR_COMM,
                            "ringattn comm mpi: rank %d: %s: no answer from some rank for %g s",
                            c->rank, what, limit);
        }
    }
}

static ringattn_status_t mpi_allreduce(ringattn_comm_t c, int64_t *vals, int n, ra_reduce_op op)
{
    mpi_impl *impl = c->impl;
    RA_CHECK(n >= 0 && n <= RA_ALLREDUCE_MAX, RINGATTN_ERR_INTERNAL,
             "ringattn comm mpi: allreduce of %d values, expected <= %d", n, RA_ALLREDUCE_MAX);
    const MPI_Op mop = op == RA_REDUCE_SUM ? MPI_SUM : op == RA_REDUCE_MIN ? MPI_MIN : MPI_MAX;
    memcpy(impl->ctl, vals, (size_t)n * sizeof *vals);
    MPI_Request req;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, impl->ctl, n, MPI_INT64_T, mop, impl->comm, &req);
    if (rc != MPI_SUCCESS) return ra__mpi_error(c, "MPI_Iallreduce", rc);
    RA_TRY(wait_collective(c, &req, "MPI_Iallreduce"));
    memcpy(vals, impl->ctl, (size_t)n * sizeof *vals);
    return RINGATTN_SUCCESS;
}

static ringattn_status_t mpi_allgather(ringattn_comm_t c, const void *send, void *recv,
                                       const size_t *bytes)
{
    mpi_impl *impl = c->impl;
    size_t at = 0;
    for (int r = 0; r < c->size; ++r) {
        RA_CHECK(bytes[r] <= (size_t)0x7fffffff && at <= (size_t)0x7fffffff,
                 RINGATTN_ERR_UNSUPPORTED,
                 "ringattn comm mpi: allgather of %zu bytes, expected < 2 GiB", at + bytes[r]);
        impl->counts[r] = (int)bytes[r];
        impl->displs[r] = (int)at;
        at += bytes[r];
    }
    MPI_Request req;
    const int rc = MPI_Iallgatherv(send, impl->counts[c->rank], MPI_BYTE, recv, impl->counts,
                                   impl->displs, MPI_BYTE, impl->comm, &req);
    if (rc != MPI_SUCCESS) return ra__mpi_error(c, "MPI_Iallgatherv", rc);
    return wait_collective(c, &req, "MPI_Iallgatherv");
}

static void impl_free(mpi_impl *impl)
{
    free(impl->counts);
    free(impl->displs);
    free(impl->notices);
    free(impl->orphans);
    free(impl);
}

static void mpi_destroy(ringattn_comm_t c)
{
    mpi_impl *impl = c->impl;
    int finalized = 0, running = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
        running = mpi_still_active(c);
        for (int r = 0; r < c->size; ++r) running += !test_done(&impl->notices[r]);
        for (size_t i = 0; i < sizeof impl->beats / sizeof impl->beats[0]; ++i)
            running += !test_done(&impl->beats[i].req);
        MPI_Comm_free(&impl->comm); /* freed by MPI once what runs on it ends */
    }
    if (running) /* MPI may still write what it holds: leave it to MPI */
        ra__log(RA_LOG_WARN, RA_SUB_COMM, c->rank, c->size,
                "comm mpi: destroyed with %d operations still running after a failure; their "
                "buffers (%zu bytes) stay allocated",
                running, sizeof *impl);
    else impl_free(impl);
    free(c);
}

static ringattn_status_t mpi_split_grid(ringattn_comm_t c, int group, ringattn_comm_t out[2]);

static const struct ra_comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce_i64 = mpi_allreduce,
    .allgather = mpi_allgather,
    .exchange_start = ra__mpi_exchange_start,
    .exchange_test = ra__mpi_exchange_test,
    .exchange_wait = ra__mpi_exchange_wait,
    .notify_failure = mpi_notify_failure,
    .peer_failed = ra__mpi_peer_failed,
    .still_active = mpi_still_active,
    .beat = mpi_beat,
    .destroy = mpi_destroy,
    .split_grid = mpi_split_grid,
};

/* The piece size (RINGATTN_MPI_CHUNK bytes, default 256 KiB), the same on every rank: the
   smallest asked for (collective, at creation). */
static int agree_chunk(mpi_impl *impl)
{
    const char *env = getenv("RINGATTN_MPI_CHUNK");
    long long want = env ? atoll(env) : 0;
    if (want < 64 || want > (1ll << 30)) want = (long long)DEFAULT_CHUNK;
    const int rc = MPI_Allreduce(MPI_IN_PLACE, &want, 1, MPI_LONG_LONG, MPI_MIN, impl->comm);
    impl->chunk = (size_t)want;
    return rc;
}

/* What a comm holds over mpi_comm: a duplicate of the caller's, its piece size agreed (chunk 0,
   collective); or, chunk > 0, a split of ours, adopted as it is with its parent's piece size
   (agreed over a superset of its ranks: the same on each, with no collective here). MPI's status,
   or -1 out of memory; the communicator held is freed on failure. */
static int comm_make(MPI_Comm mpi_comm, size_t chunk, struct ringattn_comm *c, mpi_impl *impl)
{
    int rc = MPI_SUCCESS;
    impl->chunk = chunk;
    if (chunk) impl->comm = mpi_comm;
    else rc = MPI_Comm_dup(mpi_comm, &impl->comm);
    if (rc != MPI_SUCCESS) return rc;
    rc = MPI_Comm_set_errhandler(impl->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(impl->comm, &c->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(impl->comm, &c->size);
    if (rc == MPI_SUCCESS && !chunk) rc = agree_chunk(impl);
    if (rc == MPI_SUCCESS) {
        impl->counts = malloc((size_t)c->size * sizeof *impl->counts);
        impl->displs = malloc((size_t)c->size * sizeof *impl->displs);
        impl->notices = malloc((size_t)c->size * sizeof *impl->notices);
        if (!impl->counts || !impl->displs || !impl->notices) rc = -1;
        for (int r = 0; rc == MPI_SUCCESS && r < c->size; ++r)
            impl->notices[r] = MPI_REQUEST_NULL;
        for (size_t i = 0; i < sizeof impl->beats / sizeof impl->beats[0]; ++i)
            impl->beats[i].req = MPI_REQUEST_NULL;
    }
    if (rc != MPI_SUCCESS) MPI_Comm_free(&impl->comm);
    return rc;
}

ringattn_status_t ra__mpi_check_running(const char *fn)
{
    int init = 0, finalized = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&finalized);
    RA_CHECK(init && !finalized, RINGATTN_ERR_INVALID_USAGE,
             "%s: MPI: %s, expected it between MPI_Init and MPI_Finalize", fn,
             init ? "finalised" : "not initialised");
    return RINGATTN_SUCCESS;
}

/* A comm over mpi_comm (comm_make: chunk 0 duplicates the caller's, else adopts a split). */
static ringattn_status_t comm_new(const char *fn, MPI_Comm mpi_comm, size_t chunk,
                                  ringattn_comm_t *comm)
{
    struct ringattn_comm *c = calloc(1, sizeof *c);
    mpi_impl *impl = calloc(1, sizeof *impl);
    if (!c || !impl || ra__registry_add(c) != 0) {
        free(c);
        free(impl);
        if (chunk) MPI_Comm_free(&mpi_comm); /* a split is ours */
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    const int rc = comm_make(mpi_comm, chunk, c, impl);
    if (rc != MPI_SUCCESS) {
        const ringattn_status_t st =
            rc == -1 ? ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn)
                     : ra__mpi_error(c, chunk ? "the split communicator" : "MPI_Comm_dup", rc);
        ra__registry_remove(c);
        impl_free(impl);
        free(c);
        return st;
    }
    c->ops = &mpi_ops;
    c->impl = impl;
    *comm = c;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__comm_create_mpi(const char *fn, MPI_Comm mpi_comm, ringattn_comm_t *comm)
{
    RA_CHECK(comm != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: comm: got NULL, expected a pointer to receive the communicator", fn);
    RA_TRY(ra__mpi_check_running(fn));
    RA_CHECK(mpi_comm != MPI_COMM_NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: mpi_comm: got MPI_COMM_NULL, expected a communicator", fn);
    RA_TRY(comm_new(fn, mpi_comm, 0, comm));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

/* comm.h's split_grid: both MPI_Comm_split first, on every rank whatever the first gave (they
   are collective: no rank may skip one), then a comm over each that owns it. MPI_Comm_split
   blocks without a deadline, as ringattn_comm_create_mpi's MPI_Comm_dup does. */
static ringattn_status_t mpi_split_grid(ringattn_comm_t c, int group, ringattn_comm_t out[2])
{
    static const char fn[] = "ringattn comm mpi: split";
    mpi_impl *impl = c->impl;
    MPI_Comm part[2] = {MPI_COMM_NULL, MPI_COMM_NULL};
    const int rc0 = MPI_Comm_split(impl->comm, c->rank / group, c->rank, &part[0]);
    const int rc1 = MPI_Comm_split(impl->comm, c->rank % group, c->rank, &part[1]);
    if (rc0 != MPI_SUCCESS || rc1 != MPI_SUCCESS) {
        for (int i = 0; i < 2; ++i)
            if (part[i] != MPI_COMM_NULL) MPI_Comm_free(&part[i]);
        return ra__mpi_error(c, "MPI_Comm_split", rc0 != MPI_SUCCESS ? rc0 : rc1);
    }
    const ringattn_status_t st = comm_new(fn, part[0], impl->chunk, &out[0]);
    if (st == RINGATTN_SUCCESS) return comm_new(fn, part[1], impl->chunk, &out[1]);
    MPI_Comm_free(&part[1]); /* no comm took it */
    return st;
}
