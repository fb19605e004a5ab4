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

static q_side load_q_side(const struct ringattn_plan *p, const ra_args *a, ra_thread_ws *w,
                          int h, int64_t qrow, int nq)
{
    const int D = p->head_dim, Dv = p->head_dim_v;
    q_side qd;
    int64_t ldo;
    qd.q = ra__tile_load(&a->q, p->dtype, qrow, nq, h, D, w->q, &qd.ldq);
    qd.dout = ra__tile_load(&a->dout, p->dtype, qrow, nq, h, Dv, w->dout, &qd.lddo);
    const float *o = ra__tile_load(&a->o, p->dtype, qrow, nq, h, Dv, w->o, &ldo);
    for (int i = 0; i < nq; ++i) {
        const float *oi = o + i * ldo, *gi = qd.dout + i * qd.lddo;
        float d = 0.0f;
        for (int c = 0; c < Dv; ++c) d += gi[c] * oi[c];
        w->drow[i] = d;
        w->lse[i] = a->lse[h * p->total_q + qrow + i];
    }
    return qd;
}

/*
 * SPEC 7 for one tile pair: w->s = P (0 for masked logits and for rows whose LSE marks them
 * empty), w->dp = dZ = P * (dP - D_i), times the softcap derivative 1 - tanh^2.
 */
static void tile_grads(const struct ringattn_plan *p, ra_thread_ws *w, int h, const ra_span *qs,
                       const ra_span *ks, int64_t delta, ra_block_kind kind, const q_side *qd,
                       const float *k, int64_t ldk, const float *v, int64_t ldv)
{
    const int nq = (int)qs->count, nk = (int)ks->count;
    ra__tile_logits(p, h, qs, ks, delta, kind, w->row_begin, w->row_end, qd->q, qd->ldq, k, ldk,
                    w->s, p->softcap > 0.0f ? w->tanh_s : NULL);
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

static void keys_task(const struct ringattn_plan *p, const ra_args *a, ra_thread_ws *w, int seq,
                      int g, int64_t k0, int nk, int bq)
{
    const int D = p->head_dim, Dv = p->head_dim_v, G = p->num_heads / p->num_kv_heads;
    const int64_t krow = p->cu_k[seq] + k0, qrow0 = p->cu_q[seq];
    const int64_t lq = p->cu_q[seq + 1] - qrow0, delta = ra__seq_delta(p, seq);
    const ra_span ks = {seq, k0, 1, nk}, qall = {seq, 0, 1, lq};
    int64_t qb, qe, ldk, ldv;
    ra__query_hull(p->window, delta, &ks, &qall, &qb, &qe);
    const float *k = ra__tile_load(&a->k, p->dtype, krow, nk, g, D, w->k, &ldk);
    const float *v = ra__tile_load(&a->v, p->dtype, krow, nk, g, Dv, w->v, &ldv);
    memset(w->dk, 0, (size_t)nk * D * sizeof *w->dk);
    memset(w->dv, 0, (size_t)nk * Dv * sizeof *w->dv);

    for (int h = g * G; h < (g + 1) * G; ++h) {
        for (int64_t q0 = qb / bq * bq; q0 < qe; q0 += bq) {
            const ra_span qs = {seq, q0, 1, lq - q0 < bq ? lq - q0 : bq};
            const ra_block_kind kind =
                ra__classify_block(p->window, delta, &qs, &ks, w->row_begin, w->row_end);
            if (kind == RA_BLOCK_EMPTY) continue;
            const int nq = (int)qs.count;
            const q_side qd = load_q_side(p, a, w, h, qrow0 + q0, nq);
            tile_grads(p, w, h, &qs, &ks, delta, kind, &qd, k, ldk, v, ldv);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, Dv, nq, 1.0f, w->s, nk,
                        qd.dout, (int)qd.lddo, 1.0f, w->dv, Dv);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, D, nq, p->scale, w->dp, nk,
                        qd.q, (int)qd.ldq, 1.0f, w->dk, D);
        }
    }
    ra__tile_store(&a->dk, p->dtype, krow, nk, g, D, w->dk, D);
    ra__tile_store(&a->dv, p->dtype, krow, nk, g, Dv, w->dv, Dv);
}

static void queries_task(const struct ringattn_plan *p, const ra_args *a, ra_thread_ws *w,
                         int seq, int h, int64_t q0, int nq, int bk)
{
    const int D = p->head_dim, Dv = p->head_dim_v, g = h / (p->num_heads / p->num_kv_heads);
    const int64_t qrow = p->cu_q[seq] + q0, krow0 = p->cu_k[seq];
    const int64_t lk = p->cu_k[seq + 1] - krow0, delta = ra__seq_delta(p, seq);
    const ra_span qs = {seq, q0, 1, nq}, kall = {seq, 0, 1, lk};
    int64_t kb, ke, ldk, ldv;
    ra__key_hull(p->window, delta, &qs, &kall, &kb, &ke);
    const q_side qd = load_q_side(p, a, w, h, qrow, nq);
    memset(w->acc, 0, (size_t)nq * D * sizeof *w->acc);

    for (int64_t k0 = kb / bk * bk; k0 < ke; k0 += bk) {
        const ra_span ks = {seq, k0, 1, lk - k0 < bk ? lk - k0 : bk};
        const ra_block_kind kind =
            ra__classify_block(p->window, delta, &qs, &ks, w->row_begin, w->row_end);
        if (kind == RA_BLOCK_EMPTY) continue;
        const int nk = (int)ks.count;
        const float *k = ra__tile_load(&a->k, p->dtype, krow0 + k0, nk, g, D, w->k, &ldk);
        const float *v = ra__tile_load(&a->v, p->dtype, krow0 + k0, nk, g, Dv, w->v, &ldv);
        tile_grads(p, w, h, &qs, &ks, delta, kind, &qd, k, ldk, v, ldv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, D, nk, p->scale, w->dp, nk, k,
                    (int)ldk, 1.0f, w->acc, D);
    }
    ra__tile_store(&a->dq, p->dtype, qrow, nq, h, D, w->acc, D);
}

ringattn_status_t ra__cpu_backward(struct ringattn_plan *p, const ra_args *a)
{
    const int nt = ra__cpu_threads(p);
    RA_TRY(ra__cpu_workspace(p, nt));
    const struct ra_workspace *ws = p->ws;
    const int H = p->num_heads, Hk = p->num_kv_heads;
    const int64_t key_tasks = ws->k_tiles * Hk, query_tasks = ws->q_tiles * H;
    int blas_threads;
    ra__cpu_blas_single_thread_begin(&blas_threads);
#pragma omp parallel num_threads(nt)
    {
        ra_thread_ws *w = &ws->per_thread[omp_get_thread_num()];
        int seq;
        int64_t start;
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t task = 0; task < key_tasks; ++task) {
            const int n = ra__tile_rows(ws->k_tile_first, p->cu_k, p->num_seqs, ws->block_k,
                                    task / Hk, &seq, &start);
            keys_task(p, a, w, seq, (int)(task % Hk), start, n, ws->block_q);
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < query_tasks; ++task) {
            const int n = ra__tile_rows(ws->q_tile_first, p->cu_q, p->num_seqs, ws->block_q,
                                    task / H, &seq, &start);
            queries_task(p, a, w, seq, (int)(task % H), start, n, ws->block_k);
        }
    }
    ra__cpu_blas_single_thread_end(blas_threads);
    return RINGATTN_SUCCESS;
}
