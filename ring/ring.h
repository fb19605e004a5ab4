/*
 * The ring driver (DESIGN: the ring). It reaches the kernels, the backend's memory and the
 * transport only through their tables (kernels/backend.h, comm/comm.h), and decides everything
 * a step needs before the ring starts. Internal.
 */
#ifndef RINGATTN_RING_RING_H
#define RINGATTN_RING_RING_H

#include "ring/call.h"
#include "plan/plan.h"
#include "plan/schedule.h"

/* O, LSE of the local queries over every rank's keys (one step when single-rank). */
ringattn_status_t ra__ring_forward(struct ringattn_plan *p, const ra_call *c);
/* A KV cache plan's forward (ring/cache.c): every query over every rank's cache slots and the
   new tokens' K/V; every rank gets the whole O and LSE. */
ringattn_status_t ra__cache_forward(struct ringattn_plan *p, const ra_call *c);
/* dQ of the local queries and dK, dV (dBias) of the local keys, summed over every rank. */
ringattn_status_t ra__ring_backward(struct ringattn_plan *p, const ra_call *c);

/* This call's decisions, made before the ring starts (ring/prepare.c). */
typedef struct ra_prepared {
    const float *bias;   /* every shard's bias, backend memory, shard after shard (ring), or
                            the caller's (one rank); NULL without a bias */
    const float *thr_b;  /* SPEC 6 thresholds of the local rows, backend memory; NULL: none */
    const int64_t *thr_p;
    const unsigned char *run; /* [num_steps] does step t compute */
    int last;                 /* the schedule's last compute step: the forward finishes there */
} ra_prepared;

/*
 * The key bias of every shard (gathered once on the control plane), the local rows' SPEC 6
 * thresholds, and which steps compute: those the schedule keeps, less the top-k steps whose
 * held shard no local row keeps a key of (the forward's first and last compute steps, which
 * start and finish the softmax state, always run). Collective in a ring with a key bias.
 */
ringattn_status_t ra__ring_prepare(struct ringattn_plan *p, const ra_call *c, int backward,
                                   ra_prepared *out);

/* The SPEC 6 part of step t's io: the held shard's bias and the local rows' thresholds. */
ra_dyn_io ra__ring_dyn_io(const struct ringattn_plan *p, const ra_prepared *pr, int t,
                          float *dbias);

#endif
