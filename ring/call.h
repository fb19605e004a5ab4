/*
 * One forward or backward call before the ring starts: its checked tensors, what the backend
 * found in them, and the agreement of every rank on both. Internal.
 */
#ifndef RINGATTN_RING_CALL_H
#define RINGATTN_RING_CALL_H

#include "base/view.h"
#include "plan/plan.h"

/* The checked tensors of one call (api/calls.c). */
typedef struct ra_args {
    ra_view q, k, v, o, dout, dq, dk, dv;
    float *lse;            /* [num_heads, T_q] */
    const float *key_bias; /* [H_b, T_k] or NULL */
    float *dbias;          /* [H_b, T_k] or NULL */
    ra_view k_new, v_new;  /* a KV cache plan's new tokens' K/V (cu_seqlens_new) */
    const float *key_bias_new; /* [H_b, T_new] or NULL */
    const float *sinks;    /* [num_heads] or NULL (SPEC 11) */
    float *dsinks;         /* backward: [num_heads] or NULL */
    const float *dlse;     /* backward: [num_heads, T_q] or NULL (SPEC 11) */
} ra_args;

/* What the call's inputs imply, decided before the ring starts (SPEC 9). */
typedef struct ra_call {
    ra_args a;
    int scale_q_first; /* |Q| |K| D could overflow float32: the kernels scale Q first */
    int recompute;     /* backward: some rank has rows whose LSE is lossy (ra__lse_lossy) */
    /* backward of a 2D plan's inner ring whose kv heads are replicated (plan/grid.h): dK, dV
       (packed) are written as the float32 sums, which the group adds up before rounding once.
       One rank sums dQ into dq_f32 ([T_q, H, D] packed) first. */
    int grads_f32;
    float *dq_f32;
} ra_call;

/*
 * Collective over the plan's ring: local is this rank's check of its arguments (c->a). Scans
 * them through the backend (largest |Q| and |K|; lossy LSE rows in the backward), then the
 * call's agreement (comm/comm.h: ra__comm_agree, which also checks that every rank is in the
 * same call of the same plan) tells every rank whether all arguments were valid, the largest
 * |K| of the ring and whether any rank needs the recomputation. A rank whose arguments were
 * refused keeps its own message; the others fail too, before any K/V moves, so that no rank
 * waits for one that left the call, and a retried call never meets messages of the failed one.
 */
ringattn_status_t ra__call_agree(struct ringattn_plan *p, const char *fn, ringattn_status_t local,
                                 int backward, ra_call *c);

#endif
