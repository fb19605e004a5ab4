/*
 * The MPI transport: non-blocking send/receive on a private duplicate of the caller's
 * communicator. Waits poll MPI_Testall against a deadline (RINGATTN_COMM_TIMEOUT seconds,
 * default 60) so a peer that never answers is an error, not a hang.
 */
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "base/error.h"
#include "base/host_stream.h"
#include "base/registry.h"
#include "comm/comm.h"
#include "ringattn_mpi.h"

typedef struct mpi_impl {
    MPI_Comm comm;
    int *counts, *displs; /* [size] allgather */
} mpi_impl;

static MPI_Comm comm_of(ringattn_comm_t c) { return ((mpi_impl *)c->impl)->comm; }

static ringattn_status_t mpi_error(const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return ra__fail(RINGATTN_ERR_COMM, "ringattn comm mpi: %s: %s", what, msg);
}

/* The MPI_Requests of an exchange live in its impl bytes: sends first, then receives. */
_Static_assert(2 * RA_EXCHANGE_SLOTS * sizeof(MPI_Request) <= RA_EXCHANGE_IMPL_BYTES,
               "an exchange's MPI_Requests fit its impl bytes");
static MPI_Request *reqs(ra_exchange *x) { return (MPI_Request *)(void *)x->impl; }

static ringattn_status_t mpi_test(ringattn_comm_t c, ra_exchange *x, int *done)
{
    (void)c;
    const int rc = MPI_Testall(2 * RA_EXCHANGE_SLOTS, reqs(x), done, MPI_STATUSES_IGNORE);
    return rc == MPI_SUCCESS ? RINGATTN_SUCCESS : mpi_error("MPI_Testall", rc);
}

static void mpi_poll(void *ctx)
{
    ra_exchange *x = ctx;
    int done;
    (void)mpi_test(x->comm, x, &done); /* a failure shows again in the wait */
}

static ringattn_status_t mpi_start(ringattn_comm_t c, ra_exchange *x, void *stream)
{
    MPI_Request *r = reqs(x);
    x->comm = c;
    x->tag = ra__comm_next_tag(c);
    x->stream = NULL;
    for (int i = 0; i < 2 * RA_EXCHANGE_SLOTS; ++i) r[i] = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    for (int i = 0; i < RA_EXCHANGE_SLOTS; ++i) {
        RA_CHECK(x->send[i].bytes <= (size_t)0x7fffffff && x->recv[i].bytes <= (size_t)0x7fffffff,
                 RINGATTN_ERR_UNSUPPORTED,
                 "ringattn comm mpi: message of %zu bytes, expected < 2 GiB per exchange",
                 x->send[i].bytes > x->recv[i].bytes ? x->send[i].bytes : x->recv[i].bytes);
    }
    for (int i = 0; rc == MPI_SUCCESS && i < RA_EXCHANGE_SLOTS; ++i)
        if (x->recv[i].bytes)
            rc = MPI_Irecv(x->recv[i].buf, (int)x->recv[i].bytes, MPI_BYTE, x->recv[i].peer,
                           x->tag + i, comm_of(c), &r[RA_EXCHANGE_SLOTS + i]);
    for (int i = 0; rc == MPI_SUCCESS && i < RA_EXCHANGE_SLOTS; ++i)
        if (x->send[i].bytes)
            rc = MPI_Isend(x->send[i].buf, (int)x->send[i].bytes, MPI_BYTE, x->send[i].peer,
                           x->tag + i, comm_of(c), &r[i]);
    if (rc != MPI_SUCCESS) return mpi_error("MPI_Isend/MPI_Irecv", rc);
    if (stream && ra__host_stream_attach(stream, mpi_poll, x) == 0) x->stream = stream;
    return RINGATTN_SUCCESS;
}

static ringattn_status_t mpi_wait(ringattn_comm_t c, ra_exchange *x)
{
    if (x->stream) ra__host_stream_detach(x->stream, x);
    x->stream = NULL;
    const double limit = ra__comm_timeout_s(), t0 = MPI_Wtime();
    int done = 0;
    while (!done) {
        RA_TRY(mpi_test(c, x, &done));
        if (!done && MPI_Wtime() - t0 > limit) {
            MPI_Request *r = reqs(x);
            for (int i = 0; i < 2 * RA_EXCHANGE_SLOTS; ++i)
                if (r[i] != MPI_REQUEST_NULL) {
                    MPI_Cancel(&r[i]);
                    MPI_Request_free(&r[i]);
                }
            return ra__fail(RINGATTN_ERR_COMM,
                            "ringattn comm mpi: rank %d: exchange timed out after %.0f s", c->rank,
                            limit);
        }
    }
    return RINGATTN_SUCCESS;
}

static ringattn_status_t mpi_allreduce(ringattn_comm_t c, int64_t *vals, int n, ra_reduce_op op)
{
    const MPI_Op mop = op == RA_REDUCE_SUM ? MPI_SUM : op == RA_REDUCE_MIN ? MPI_MIN : MPI_MAX;
    const int rc = MPI_Allreduce(MPI_IN_PLACE, vals, n, MPI_INT64_T, mop, comm_of(c));
    return rc == MPI_SUCCESS ? RINGATTN_SUCCESS : mpi_error("MPI_Allreduce", rc);
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
    const int rc = MPI_Allgatherv(send, impl->counts[c->rank], MPI_BYTE, recv, impl->counts,
                                  impl->displs, MPI_BYTE, impl->comm);
    return rc == MPI_SUCCESS ? RINGATTN_SUCCESS : mpi_error("MPI_Allgatherv", rc);
}

static void mpi_destroy(ringattn_comm_t c)
{
    mpi_impl *impl = c->impl;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&impl->comm);
    free(impl->counts);
    free(impl->displs);
    free(impl);
    free(c);
}

static const struct ra_comm_ops mpi_ops = {
    .name = "mpi",
    .allreduce_i64 = mpi_allreduce,
    .allgather = mpi_allgather,
    .exchange_start = mpi_start,
    .exchange_test = mpi_test,
    .exchange_wait = mpi_wait,
    .destroy = mpi_destroy,
};

ringattn_status_t ringattn_comm_create_mpi(MPI_Comm mpi_comm, ringattn_comm_t *comm)
{
    static const char fn[] = "ringattn_comm_create_mpi";
    RA_CHECK(comm != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: comm: got NULL, expected a pointer to receive the communicator", fn);
    int init = 0;
    MPI_Initialized(&init);
    RA_CHECK(init, RINGATTN_ERR_INVALID_USAGE, "%s: MPI: not initialised, expected MPI_Init first",
             fn);
    RA_CHECK(mpi_comm != MPI_COMM_NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: mpi_comm: got MPI_COMM_NULL, expected a communicator", fn);
    struct ringattn_comm *c = calloc(1, sizeof *c);
    mpi_impl *impl = calloc(1, sizeof *impl);
    if (!c || !impl || ra__registry_add(c) != 0) {
        free(c);
        free(impl);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    int rc = MPI_Comm_dup(mpi_comm, &impl->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(impl->comm, &c->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(impl->comm, &c->size);
    if (rc == MPI_SUCCESS) {
        impl->counts = malloc((size_t)c->size * sizeof *impl->counts);
        impl->displs = malloc((size_t)c->size * sizeof *impl->displs);
    }
    if (rc != MPI_SUCCESS || !impl->counts || !impl->displs) {
        ra__registry_remove(c);
        if (rc == MPI_SUCCESS) MPI_Comm_free(&impl->comm);
        free(impl->counts);
        free(impl->displs);
        free(c);
        free(impl);
        return rc != MPI_SUCCESS ? mpi_error("MPI_Comm_dup", rc)
                                 : ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    }
    c->ops = &mpi_ops;
    c->impl = impl;
    *comm = c;
    return RINGATTN_SUCCESS;
}
