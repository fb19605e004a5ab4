/* The ring driver (DESIGN: "two small tables and one loop"). Internal. */
#ifndef RINGATTN_RING_RING_H
#define RINGATTN_RING_RING_H

#include "base/view.h"
#include "ring/plan/plan.h"

/* The checked tensors of one forward or backward call (ring/api.c). */
typedef struct ra_args {
    ra_view q, k, v, o, dout, dq, dk, dv;
    float *lse;            /* [num_heads, T_q] */
    const float *key_bias; /* [H_b, T_k] or NULL */
    float *dbias;          /* [H_b, T_k] or NULL */
} ra_args;

/* O, LSE of the local queries over every rank's keys (one step when single-rank). */
ringattn_status_t ra__ring_forward(struct ringattn_plan *p, const ra_args *a);
/* dQ of the local queries and dK, dV of the local keys, summed over every rank (SPEC 7). */
ringattn_status_t ra__ring_backward(struct ringattn_plan *p, const ra_args *a);
void ra__ring_free(struct ra_ring *ring);

#endif
