/*
 * CPU backward (SPEC 7), deterministic and with O(threads x tile) workspace plus three values
 * per query row (the prologue's, once per call):
 *   keys pass (keys.c): one (key tile, kv head) per task sums dK, dV over every query head of
 *                 its GQA group and every query tile that can see it;
 *   queries pass: one (query tile, head) per task sums dQ over the key tiles it sees.
 * Each output has one owner task, so no reduction depends on thread timing. P and dS are
 * recomputed in both passes (7 tile products per pair instead of 5: the price of no atomics
 * and no O(T) partial-dQ buffers).
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "base/error.h"
#include "base/host_stream.h"
#include "kernels/cpu/backward.h"
#include "kernels/softmax_state.h"

ra_q_side ra__load_q_side(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                          int h, int64_t qrow, int nq)
{
    ra_q_side qd;
    const int64_t at = h * p->queries->rows + qrow;
    qd.q = ra__tile_load(io->q, p->dtype, qrow, nq, h, p->head_dim, w->q, &qd.ldq);
    qd.logits_q = ra__qtile(p, qd.q, qd.ldq, nq, io->scale_q_first, w->q_scaled);
    qd.dout = ra__tile_load(io->dout, p->dtype, qrow, nq, h, p->head_dim_v, w->dout, &qd.lddo);
    qd.lse = io->lse + at;
    qd.drow = w->drow + at;
    qd.pshift = w->pshift + at;
    qd.pscale = w->pscale + at;
    return qd;
}

/*
 * The prologue of rows [qrow, qrow + nq) of head h: SPEC 7 D_i = dot(dO_i, O_i) (every tile pair
 * of both passes reads it), and SPEC 9's P = exp(s - shift) * scale: shift = LSE and scale = 1,
 * or, where LSE is lossy and the row's stats were recomputed, shift = m and scale = 1 / l.
 */
static void prologue_rows(const ra_kernel_params *p, const ra_bwd_prologue_io *io,
                          ra_thread_ws *w, int h, int64_t qrow, int nq)
{
    const int Dv = p->head_dim_v;
    const int64_t at = h * p->queries->rows + qrow;
    int64_t ldo, lddo;
    const float *o = ra__tile_load(io->o, p->dtype, qrow, nq, h, Dv, w->o, &ldo);
    const float *g = ra__tile_load(io->dout, p->dtype, qrow, nq, h, Dv, w->dout, &lddo);
    for (int i = 0; i < nq; ++i) {
        float d = 0.0f;
        for (int c = 0; c < Dv; ++c) d += g[i * lddo + c] * o[i * ldo + c];
        w->drow[at + i] = d;
        const float lse = io->lse[at + i];
        const int recompute = io->row_m && ra__lse_lossy(lse) && io->row_l[at + i] > 0.0f;
        w->pshift[at + i] = recompute ? io->row_m[at + i] : lse;
        w->pscale[at + i] = recompute ? 1.0f / io->row_l[at + i] : 1.0f;
    }
}

ringattn_status_t ra__cpu_backward_prologue(struct ra_workspace *ws, const ra_kernel_params *p,
                                            const ra_bwd_prologue_io *io)
{
    const int nt = ra__cpu_threads(p, ws), H = p->num_heads;
    const ra_tiling qt = ra__tiling_make(p->queries, p->block_q, ws->q_first);
    const int64_t tasks = qt.tiles * H;
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t task = 0; task < tasks; ++task) {
        ra_span span;
        int64_t row;
        ra__tiling_tile(&qt, p->queries, task / H, &span, &row);
        prologue_rows(p, io, &ws->per_thread[omp_get_thread_num()], (int)(task % H), row,
                      (int)span.count);
    }
    return RINGATTN_SUCCESS;
}

/* One row of P and dS (before the softcap derivative): p = exp(s - shift) * scale, in place. */
static void row_probs(float *restrict ps, float *restrict dz, int nk, float shift, float scale,
                      float di)
{
    if (scale == 1.0f) { /* every row whose LSE is exact enough (SPEC 9) */
#pragma omp simd
        for (int j = 0; j < nk; ++j) {
            const float pij = ra__exp(ps[j] - shift);
            ps[j] = pij;
            dz[j] = pij * (dz[j] - di);
        }
        return;
    }
#pragma omp simd
    for (int j = 0; j < nk; ++j) {
        const float pij = ra__exp(ps[j] - shift) * scale;
        ps[j] = pij;
        dz[j] = pij * (dz[j] - di);
    }
}

void ra__tile_grads(const ra_kernel_params *p, ra_thread_ws *w, int nq, int nk,
                    const ra_q_side *qd, const float *v, int64_t ldv, float *dbias)
{
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, p->head_dim_v, 1.0f, qd->dout,
                (int)qd->lddo, v, (int)ldv, 0.0f, w->dp, nk);
    for (int i = 0; i < nq; ++i) {
        float *ps = w->s + (size_t)i * nk, *dz = w->dp + (size_t)i * nk;
        if (ra__lse_is_empty(qd->lse[i])) { /* a row with no allowed key contributes nothing */
            memset(ps, 0, (size_t)nk * sizeof *ps);
            memset(dz, 0, (size_t)nk * sizeof *dz);
            continue;
        }
        row_probs(ps, dz, nk, qd->pshift[i], qd->pscale[i], qd->drow[i]);
        if (dbias)
#pragma omp simd
            for (int j = 0; j < nk; ++j) dbias[j] += dz[j];
        if (p->softcap > 0.0f) {
            const float *t = w->tanh_s + (size_t)i * nk;
            for (int j = 0; j < nk; ++j) dz[j] *= 1.0f - t[j] * t[j];
        }
    }
}

/* dQ += scale * dZ K over a gathered batch of keys (SPEC 6 selection). */
static void queries_batch(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                          const ra_span *qs, int h, const ra_q_side *qd, const ra_key_batch *b,
                          const ra_tile_dyn *dyn)
{
    const int D = p->head_dim, Dv = p->head_dim_v, g = h / (p->num_heads / p->num_kv_heads);
    ra__batch_gather(p, io->k, io->v, g, b, w->kb, w->vb);
    ra__batch_logits(p, h, qs, b, &qd->logits_q, w->kb, w->s, ra__tanh_buf(p, w), dyn);
    ra__tile_grads(p, w, (int)qs->count, b->n, qd, w->vb, Dv, NULL);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)qs->count, D, b->n, p->scale,
                w->dp, b->n, w->kb, D, 1.0f, w->acc, D);
}

/* dQ of the query tile qs (local rows from qrow) of head h over every key segment it sees. */
static void queries_task(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                         const ra_span *qs, int64_t qrow, int h)
{
    const int D = p->head_dim, Dv = p->head_dim_v, g = h / (p->num_heads / p->num_kv_heads);
    const int nq = (int)qs->count;
    int64_t ldk, ldv;
    const ra_q_side qd = ra__load_q_side(p, io, w, h, qrow, nq);
    memset(w->acc, 0, (size_t)nq * D * sizeof *w->acc);

    ra_key_pieces kp;
    ra__pieces_begin(&kp, p, &io->dyn, w, qs, qrow, io->keys, h, p->block_k);
    for (ra_piece piece; (piece = ra__pieces_next(&kp)) != RA_PIECE_END;) {
        if (piece == RA_PIECE_BATCH) {
            queries_batch(p, io, w, qs, h, &qd, &kp.batch, &kp.sel);
            continue;
        }
        const int nk = (int)kp.ks.count;
        const float *k = ra__tile_load(io->k, p->dtype, kp.krow, nk, g, D, w->k, &ldk);
        const float *v = ra__tile_load(io->v, p->dtype, kp.krow, nk, g, Dv, w->v, &ldv);
        ra__tile_logits(p, h, qs, &kp.ks, p->delta[qs->seq], kp.kind, w->row_begin, w->row_end,
                        &qd.logits_q, k, ldk, w->s, ra__tanh_buf(p, w), kp.use);
        ra__tile_grads(p, w, nq, nk, &qd, v, ldv, NULL);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, p->scale, w->dp, nk, k,
                    (int)ldk, 1.0f, w->acc, D);
    }
    ra__tile_store(io->dq, p->dtype, io->accumulate, qrow, nq, h, D, w->acc, D);
}

ringattn_status_t ra__cpu_attend_backward(struct ra_workspace *ws, const ra_kernel_params *p,
                                          const ra_bwd_io *io)
{
    const int nt = ra__cpu_threads(p, ws);
    const ra_tiling qt = ra__tiling_make(p->queries, p->block_q, ws->q_first);
    const ra_tiling kt = ra__tiling_make(io->keys, p->keys_block, ws->k_first);
    const int H = p->num_heads, Hk = p->num_kv_heads;
    /* kv heads per keys task: all of them when they share one bias head (H_b = 1 < H_kv) */
    const int gb = io->dyn.dbias && p->bias_heads < Hk ? Hk : 1, blocks = Hk / gb;
    const int64_t key_tasks = kt.tiles * blocks, query_tasks = qt.tiles * H;
    int blas_threads;
    ra__cpu_blas_single_thread_begin(&blas_threads);
#pragma omp parallel num_threads(nt)
    {
        ra_thread_ws *w = &ws->per_thread[omp_get_thread_num()];
        ra_span span;
        int64_t row;
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t task = 0; task < key_tasks; ++task) {
            ra__tiling_tile(&kt, io->keys, task / blocks, &span, &row);
            const int g0 = (int)(task % blocks) * gb;
            ra__keys_task(p, io, w, &span, row, g0, g0 + gb);
            if (omp_get_thread_num() == 0) ra__host_stream_poll(io->stream);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < query_tasks; ++task) {
            ra__tiling_tile(&qt, p->queries, task / H, &span, &row);
            queries_task(p, io, w, &span, row, (int)(task % H));
            if (omp_get_thread_num() == 0) ra__host_stream_poll(io->stream);
        }
    }
    ra__cpu_blas_single_thread_end(blas_threads);
    return RINGATTN_SUCCESS;
}
