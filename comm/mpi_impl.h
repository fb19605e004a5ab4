/*
 * What the MPI transport's files share (comm/mpi.c: the comm, the control plane and failures;
 * comm/mpi_exchange.c: the data plane). Internal.
 */
#ifndef RINGATTN_COMM_MPI_IMPL_H
#define RINGATTN_COMM_MPI_IMPL_H

#include <mpi.h>

#include "comm/comm.h"

typedef struct mpi_impl {
    MPI_Comm comm;        /* a private duplicate, MPI_ERRORS_RETURN */
    int *counts, *displs; /* [size] allgather */
    size_t chunk;         /* bytes per message piece, the same on every rank (mpi.c) */
    /* The control plane's values live here, not on a caller's stack: a collective given up at
       its deadline still owns them (MPI cannot cancel or free it). */
    int64_t ctl[RA_ALLREDUCE_MAX];
    char notice[RA_COMM_REASON_BYTES]; /* the failure notice this rank sent its peers */
    MPI_Request *notices;              /* [size] its sends */
    /* Operations given up at an error but still running (c->active counts those over caller
       memory; collectives and notices are kept here as well). */
    MPI_Request *orphans;
    int num_orphans, cap_orphans;
    /* Heartbeats in flight (comm/mpi_exchange.c): each carries the age of its sender's last
       progress, in its own buffer until its send completes. */
    struct {
        double age;
        MPI_Request req;
    } beats[16];
} mpi_impl;

static inline MPI_Comm ra__mpi_comm_of(ringattn_comm_t c)
{
    return ((mpi_impl *)c->impl)->comm;
}

/* The MPI transport's comm over a duplicate of mpi_comm, fn naming the public entry point
   (ringattn_comm_create_mpi, ringattn_comm_create_mpi_fortran). */
ringattn_status_t ra__comm_create_mpi(const char *fn, MPI_Comm mpi_comm, ringattn_comm_t *comm);
/* RINGATTN_ERR_INVALID_USAGE unless MPI is initialised and not yet finalised. */
ringattn_status_t ra__mpi_check_running(const char *fn);

/* RINGATTN_ERR_COMM with MPI's own message. */
ringattn_status_t ra__mpi_error(ringattn_comm_t c, const char *what, int rc);

/* Keeps a request that was given up but may still run over caller memory (c->active). When
   nothing can be kept, the request is freed and the comm stays active for good. */
void ra__mpi_orphan(ringattn_comm_t c, MPI_Request *req);

/* The data plane's entry points (comm/mpi_exchange.c). */
ringattn_status_t ra__mpi_exchange_start(ringattn_comm_t c, ra_exchange *x, void *stream);
ringattn_status_t ra__mpi_exchange_test(ringattn_comm_t c, ra_exchange *x, int *done);
ringattn_status_t ra__mpi_exchange_wait(ringattn_comm_t c, ra_exchange *x);
/* Heartbeats (comm/mpi_exchange.c). send: to peer, saying the sender progressed `age` seconds
   ago (skipped when all buffers are in flight). heard: takes every heartbeat that arrived and
   moves *last (the time of the latest progress) to the freshest one from a rank `from`
   accepts (NULL: any rank). */
void ra__mpi_send_beat(ringattn_comm_t c, int peer, double age);
void ra__mpi_heard(ringattn_comm_t c, int (*from)(const void *, int), const void *ctx,
                   double now, double *last);
/* Has a peer sent a failure notice? Then its text into c->reason and nonzero. */
int ra__mpi_peer_failed(ringattn_comm_t c);

#endif
