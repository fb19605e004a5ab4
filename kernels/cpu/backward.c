/*
 * CPU backward (SPEC 7), deterministic and with O(threads x tile) workspace, in two passes:
 *   keys pass:    one (key tile, kv head) per task sums dK, dV over every query head of its
 *                 GQA group and every query tile that can see it;
 *   queries pass: one (query tile, head) per task sums dQ over the key tiles it sees.
 * Each output has one owner task, so no reduction depends on thread timing. P and dS are
 * recomputed in both passes (7 tile products per pair instead of 5: the price of no atomics
 * and no O(T) partial-dQ buffers).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/softmax_state.h"
#include "ring/error.h"

/* Query-side inputs of one (query tile, head): Q, dO, LSE and D_i = dot(dO_i, O_i). */
typedef struct q_side {
    const float *q, *dout;
    int64_t ldq, lddo;
} q_side;

static q_side load_q_side(const struct ringattn_plan *p, const ra_bwd_io *io, ra_thread_ws *w,
                          int h, int64_t qrow, int nq)
{
    const int D = p->head_dim, Dv = p->head_dim_v;
    q_side qd;
    int64_t ldo;
    qd.q = ra__tile_load(io->q, p->dtype, qrow, nq, h, D, w->q, &qd.ldq);
    qd.dout = ra__tile_load(io->dout, p->dtype, qrow, nq, h, Dv, w->dout, &qd.lddo);
    const float *o = ra__tile_load(io->o, p->dtype, qrow, nq, h, Dv, w->o, &ldo);
    for (int i = 0; i < nq; ++i) {
        const float *oi = o + i * ldo, *gi = qd.dout + i * qd.lddo;
        float d = 0.0f;
        for (int c = 0; c < Dv; ++c) d += gi[c] * oi[c];
        w->drow[i] = d;
        w->lse[i] = io->lse[h * io->qsh->rows + qrow + i];
    }
    return qd;
}

/*
 * SPEC 7 for one tile pair: w->s = P (0 for masked logits and for rows whose LSE marks them
 * empty), w->dp = dZ = P * (dP - D_i), times the softcap derivative 1 - tanh^2.
 */
static void tile_grads(const struct ringattn_plan *p, ra_thread_ws *w, int h, const ra_span *qs,
                       const ra_span *ks, ra_block_kind kind, const q_side *qd, const float *k,
                       int64_t ldk, const float *v, int64_t ldv)
{
    const int nq = (int)qs->count, nk = (int)ks->count;
    ra__tile_logits(p, h, qs, ks, p->delta[qs->seq], kind, w->row_begin, w->row_end, qd->q,
                    qd->ldq, k, ldk, w->s, p->softcap > 0.0f ? w->tanh_s : NULL);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, p->head_dim_v, 1.0f, qd->dout,
                (int)qd->lddo, v, (int)ldv, 0.0f, w->dp, nk);
    for (int i = 0; i < nq; ++i) {
        float *ps = w->s + (size_t)i * nk, *dz = w->dp + (size_t)i * nk;
        const float lse = w->lse[i], di = w->drow[i];
        if (ra__lse_is_empty(lse)) { /* a row with no allowed key contributes nothing */
            memset(ps, 0, (size_t)nk * sizeof *ps);
            memset(dz, 0, (size_t)nk * sizeof *dz);
            continue;
        }
#pragma omp simd
        for (int j = 0; j < nk; ++j) {
            const float pij = ra__exp(ps[j] - lse);
            ps[j] = pij;
            dz[j] = pij * (dz[j] - di);
        }
        if (p->softcap > 0.0f) {
            const float *t = w->tanh_s + (size_t)i * nk;
            for (int j = 0; j < nk; ++j) dz[j] *= 1.0f - t[j] * t[j];
        }
    }
}

/* dK, dV of the key tile ks (local rows from krow) of kv head g: over its GQA group's heads and
   every query tile of the local queries that can see it. */
static void keys_task(const struct ringattn_plan *p, const ra_bwd_io *io, ra_thread_ws *w,
                      const ra_span *ks, int64_t krow, int g, int bq)
{
    const int D = p->head_dim, Dv = p->head_dim_v, G = p->num_heads / p->num_kv_heads;
    const int nk = (int)ks->count;
    int64_t ldk, ldv, qrow;
    const float *k = ra__tile_load(io->k, p->dtype, krow, nk, g, D, w->k, &ldk);
    const float *v = ra__tile_load(io->v, p->dtype, krow, nk, g, Dv, w->v, &ldv);
    memset(w->dk, 0, (size_t)nk * D * sizeof *w->dk);
    memset(w->dv, 0, (size_t)nk * Dv * sizeof *w->dv);

    for (int h = g * G; h < (g + 1) * G; ++h) {
        ra_tile_walk walk;
        ra_span qs;
        ra_block_kind kind;
        ra__walk_begin(&walk, p, ks, 0, io->qsh, bq, w->row_begin, w->row_end);
        while (ra__walk_next(&walk, &qs, &qrow, &kind)) {
            const int nq = (int)qs.count;
            const q_side qd = load_q_side(p, io, w, h, qrow, nq);
            tile_grads(p, w, h, &qs, ks, kind, &qd, k, ldk, v, ldv);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, Dv, nq, 1.0f, w->s, nk,
                        qd.dout, (int)qd.lddo, 1.0f, w->dv, Dv);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, p->scale, w->dp, nk,
                        qd.q, (int)qd.ldq, 1.0f, w->dk, D);
        }
    }
    ra__tile_store(io->dk, p->dtype, io->accumulate, krow, nk, g, D, w->dk, D);
    ra__tile_store(io->dv, p->dtype, io->accumulate, krow, nk, g, Dv, w->dv, Dv);
}

/* dQ of the query tile qs (local rows from qrow) of head h over every key segment it sees. */
static void queries_task(const struct ringattn_plan *p, const ra_bwd_io *io, ra_thread_ws *w,
                         const ra_span *qs, int64_t qrow, int h, int bk)
{
    const int D = p->head_dim, Dv = p->head_dim_v, g = h / (p->num_heads / p->num_kv_heads);
    const int nq = (int)qs->count;
    int64_t ldk, ldv, krow;
    const q_side qd = load_q_side(p, io, w, h, qrow, nq);
    memset(w->acc, 0, (size_t)nq * D * sizeof *w->acc);

    ra_tile_walk walk;
    ra_span ks;
    ra_block_kind kind;
    ra__walk_begin(&walk, p, qs, 1, io->ksh, bk, w->row_begin, w->row_end);
    while (ra__walk_next(&walk, &ks, &krow, &kind)) {
        const int nk = (int)ks.count;
        const float *k = ra__tile_load(io->k, p->dtype, krow, nk, g, D, w->k, &ldk);
        const float *v = ra__tile_load(io->v, p->dtype, krow, nk, g, Dv, w->v, &ldv);
        tile_grads(p, w, h, qs, &ks, kind, &qd, k, ldk, v, ldv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, p->scale, w->dp, nk, k,
                    (int)ldk, 1.0f, w->acc, D);
    }
    ra__tile_store(io->dq, p->dtype, io->accumulate, qrow, nq, h, D, w->acc, D);
}

ringattn_status_t ra__cpu_attend_backward(struct ringattn_plan *p, const ra_bwd_io *io)
{
    const int nt = ra__cpu_threads(p);
    RA_TRY(ra__cpu_workspace(p, nt));
    const struct ra_workspace *ws = p->ws;
    const ra_tiling qt = ra__tiling_make(io->qsh, ws->block_q, ws->q_first);
    const ra_tiling kt = ra__tiling_make(io->ksh, ws->block_k, ws->k_first);
    const int H = p->num_heads, Hk = p->num_kv_heads;
    const int64_t key_tasks = kt.tiles * Hk, query_tasks = qt.tiles * H;
    int blas_threads;
    ra__cpu_blas_single_thread_begin(&blas_threads);
#pragma omp parallel num_threads(nt)
    {
        ra_thread_ws *w = &ws->per_thread[omp_get_thread_num()];
        ra_span span;
        int64_t row;
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t task = 0; task < key_tasks; ++task) {
            ra__tiling_tile(&kt, io->ksh, task / Hk, &span, &row);
            keys_task(p, io, w, &span, row, (int)(task % Hk), ws->block_q);
            if (io->progress.fn && omp_get_thread_num() == 0) io->progress.fn(io->progress.ctx);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < query_tasks; ++task) {
            ra__tiling_tile(&qt, io->qsh, task / H, &span, &row);
            queries_task(p, io, w, &span, row, (int)(task % H), ws->block_k);
            if (io->progress.fn && omp_get_thread_num() == 0) io->progress.fn(io->progress.ctx);
        }
    }
    ra__cpu_blas_single_thread_end(blas_threads);
    return RINGATTN_SUCCESS;
}

