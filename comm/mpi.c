/*
 * The MPI transport: non-blocking send/receive on a private duplicate of the caller's
 * communicator. Waits poll MPI_Testall against a deadline (RINGATTN_COMM_TIMEOUT seconds,
 * default 60) so a peer that never answers is an error, not a hang.
 */
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "comm/comm.h"
#include "include/ringattn_mpi.h"
#include "base/error.h"
#include "base/registry.h"

typedef struct mpi_impl {
    MPI_Comm comm;
} mpi_impl;

static MPI_Comm comm_of(ringattn_comm_t c) { return ((mpi_impl *)c->impl)->comm; }

static ringattn_status_t mpi_error(const char *what, int rc)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return ra__fail(RINGATTN_ERR_COMM, "ringattn comm mpi: %s: %s", what, msg);
}

/* The two MPI_Requests of a ra_request live in its val[] slots (MPI_Request is an int or a
   pointer, both fit in int64). */
static MPI_Request *reqs(ra_request *r) { return (MPI_Request *)(void *)r->val; }

static ringattn_status_t mpi_start(ringattn_comm_t c, const void *sendbuf, size_t send_bytes,
                                   int dst, void *recvbuf, size_t recv_bytes, int src, int tag,
                                   ra_request *req)
{
    MPI_Request *r = reqs(req);
    r[0] = r[1] = MPI_REQUEST_NULL;
    RA_CHECK(send_bytes <= (size_t)0x7fffffff && recv_bytes <= (size_t)0x7fffffff,
             RINGATTN_ERR_UNSUPPORTED,
             "ringattn comm mpi: message of %zu bytes, expected < 2 GiB per exchange",
             send_bytes > recv_bytes ? send_bytes : recv_bytes);
    int rc = MPI_SUCCESS;
    if (recv_bytes)
        rc = MPI_Irecv(recvbuf, (int)recv_bytes, MPI_BYTE, src, tag, comm_of(c), &r[1]);
    if (rc == MPI_SUCCESS && send_bytes)
        rc = MPI_Isend(sendbuf, (int)send_bytes, MPI_BYTE, dst, tag, comm_of(c), &r[0]);
    return rc == MPI_SUCCESS ? RINGATTN_SUCCESS : mpi_error("MPI_Isend/MPI_Irecv", rc);
}

static ringattn_status_t mpi_test(ringattn_comm_t c, ra_request *req, int *done)
{
    (void)c;
    const int rc = MPI_Testall(2, reqs(req), done, MPI_STATUSES_IGNORE);
    return rc == MPI_SUCCESS ? RINGATTN_SUCCESS : mpi_error("MPI_Testall", rc);
}

static ringattn_status_t mpi_wait(ringattn_comm_t c, ra_request *req)
{
    const double limit = ra__comm_timeout_s(), t0 = MPI_Wtime();
    int done = 0;
    while (!done) {
        RA_TRY(mpi_test(c, req, &done));
        if (!done && MPI_Wtime() - t0 > limit) {
            MPI_Request *r = reqs(req);
            for (int i = 0; i < 2; ++i)
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

static void mpi_destroy(ringattn_comm_t c)
{
    mpi_impl *impl = c->impl;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&impl->comm);
    free(impl);
    free(c);
}

static const struct ra_comm_ops mpi_ops = {
    .name = "mpi",
    .sendrecv_start = mpi_start,
    .test = mpi_test,
    .wait = mpi_wait,
    .allreduce_i64 = mpi_allreduce,
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
    if (rc != MPI_SUCCESS) {
        ra__registry_remove(c);
        free(c);
        free(impl);
        return mpi_error("MPI_Comm_dup", rc);
    }
    c->ops = &mpi_ops;
    c->impl = impl;
    *comm = c;
    return RINGATTN_SUCCESS;
}
