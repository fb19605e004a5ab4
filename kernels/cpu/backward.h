/*
 * What the CPU backward's parts share (backward.c: the prologue, the call and the sums over
 * ranges; grads.c: one task): the query side of a tile pair, SPEC 7 on a tile's logits and the
 * partial dK, dV, dBias slots. Internal to kernels/cpu.
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
 * The partial sums of the backward's tasks (workspace.c sizes them at plan creation): slot j
 * holds the dK, dV and dBias that query range j of every sequence adds, float32, [ranges,
 * H_kv, key rows, D] and [ranges, H_kv, key rows, D_v], and [ranges, db_rows, key rows] with
 * db_rows = H when H_b = H > H_kv, else H_kv (H_b = 1 sums those rows afterwards). Key rows
 * are the call's key shard's, at most the plan's largest.
 */
typedef struct ra_bwd_parts {
    float *dk, *dv, *db;
    int ranges, kv_heads, d, dv_dim, db_rows;
} ra_bwd_parts;

static inline float *ra__bwd_slot_dk(const ra_bwd_parts *s, int j, int g, int64_t tk)
{
    return s->dk + ((size_t)j * s->kv_heads + g) * (size_t)tk * s->d;
}

static inline float *ra__bwd_slot_dv(const ra_bwd_parts *s, int j, int g, int64_t tk)
{
    return s->dv + ((size_t)j * s->kv_heads + g) * (size_t)tk * s->dv_dim;
}

static inline float *ra__bwd_slot_db(const ra_bwd_parts *s, int j, int r, int64_t tk)
{
    return s->db + ((size_t)j * s->db_rows + r) * (size_t)tk;
}

/*
 * One task (grads.c): query range j (of parts->ranges) of sequence s, query heads of kv head
 * g: dQ of its rows written (added to with accumulate), its slot's dK, dV (dBias) rows of
 * sequence s zeroed and then summed over its tile pairs.
 */
void ra__grads_task(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                    const ra_bwd_parts *parts, int s, int g, int j);

#endif
