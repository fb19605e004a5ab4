/*
 * What the CPU backward's two passes share (backward.c: prologue, queries pass, the call;
 * keys.c: the keys pass): the query side of a tile pair and SPEC 7 on a tile's logits.
 * Internal to kernels/cpu.
 */
#ifndef RINGATTN_KERNELS_CPU_BACKWARD_H
#define RINGATTN_KERNELS_CPU_BACKWARD_H

#include "kernels/cpu/cpu.h"

/* Query-side inputs of one (query tile, head): Q (as it is, and as the logits' operand), dO,
   LSE and the prologue's D_i and probability shift and scale. */
typedef struct ra_q_side {
    const float *q, *dout;
    int64_t ldq, lddo;
    ra_qtile logits_q;
    const float *lse, *drow, *pshift, *pscale; /* [nq] each */
} ra_q_side;

ra_q_side ra__load_q_side(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                          int h, int64_t qrow, int nq);

/*
 * SPEC 7 for one tile pair whose logits are in w->s (tanh in w->tanh_s with softcap): w->s
 * becomes P (0 for masked logits and for rows whose LSE marks them empty), w->dp becomes
 * dZ = P * (dP - D_i) times the softcap derivative 1 - tanh^2. dbias, when not NULL, gets the
 * column sums of dS = P * (dP - D_i) added (the bias enters s directly).
 */
void ra__tile_grads(const ra_kernel_params *p, ra_thread_ws *w, int nq, int nk,
                    const ra_q_side *qd, const float *v, int64_t ldv, float *dbias);

/* The softcap's tanh values, kept for its derivative (NULL without softcap). */
static inline float *ra__tanh_buf(const ra_kernel_params *p, ra_thread_ws *w)
{
    return p->softcap > 0.0f ? w->tanh_s : NULL;
}

/*
 * The keys pass's task (keys.c): dK, dV of the key tile ks (local rows from krow) for kv heads
 * [g0, g1), over each GQA group's heads and every query tile of the local queries that can
 * see it, and the tile's dBias rows of those heads (a task covers every kv head sharing a bias
 * head, so it owns its dBias rows).
 */
void ra__keys_task(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                   const ra_span *ks, int64_t krow, int g0, int g1);

#endif
