/*
 * CPU forward: one (query tile, head) per task, key tiles streamed through the guarded online
 * softmax of SPEC 4. Loop bounds come from the mask hull and EMPTY tiles are skipped, so a
 * window of W costs O(T * W). Each row's reduction order is fixed: results do not depend on
 * the thread count or timing.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>

#include "kernels/cpu/cpu.h"
#include "kernels/softmax_state.h"
#include "ring/error.h"

/*
 * SPEC 4 on the rows of one tile: s becomes p = exp(s - m_new) in place. A row that has seen no
 * allowed key yet (guard) keeps its state and gets p = 0, so the PV product adds nothing.
 */
static void softmax_tile(float *s, int nq, int nk, float *m, float *l, float *acc, int dv)
{
    for (int i = 0; i < nq; ++i) {
        float *row = s + (size_t)i * nk;
        float mb = -INFINITY, alpha, sum = 0.0f;
#pragma omp simd reduction(max : mb)
        for (int j = 0; j < nk; ++j) mb = row[j] > mb ? row[j] : mb;
        if (!ra__state_rescale(&m[i], mb, &alpha)) {
            for (int j = 0; j < nk; ++j) row[j] = 0.0f;
            continue;
        }
        const float mi = m[i];
#pragma omp simd reduction(+ : sum)
        for (int j = 0; j < nk; ++j) {
            const float e = ra__exp(row[j] - mi);
            row[j] = e;
            sum += e;
        }
        l[i] = alpha * l[i] + sum;
        if (alpha != 1.0f)
            for (int c = 0; c < dv; ++c) acc[(size_t)i * dv + c] *= alpha;
    }
}

static void forward_qtile(const struct ringattn_plan *p, const ra_args *a, ra_thread_ws *w,
                          int seq, int h, int64_t q0, int nq, int bk)
{
    const int D = p->head_dim, Dv = p->head_dim_v, g = h / (p->num_heads / p->num_kv_heads);
    const int64_t qrow = p->cu_q[seq] + q0, krow = p->cu_k[seq];
    const int64_t lk = p->cu_k[seq + 1] - krow, delta = ra__seq_delta(p, seq);
    const ra_span qs = {seq, q0, 1, nq}, kall = {seq, 0, 1, lk};
    int64_t kb, ke, ldq, ldk, ldv;
    ra__key_hull(p->window, delta, &qs, &kall, &kb, &ke);
    const float *q = ra__tile_load(&a->q, p->dtype, qrow, nq, h, D, w->q, &ldq);
    for (int i = 0; i < nq; ++i) ra__state_init(&w->m[i], &w->l[i], w->acc + (size_t)i * Dv, Dv);

    for (int64_t k0 = kb / bk * bk; k0 < ke; k0 += bk) {
        const ra_span ks = {seq, k0, 1, lk - k0 < bk ? lk - k0 : bk};
        const ra_block_kind kind =
            ra__classify_block(p->window, delta, &qs, &ks, w->row_begin, w->row_end);
        if (kind == RA_BLOCK_EMPTY) continue;
        const int nk = (int)ks.count;
        const float *k = ra__tile_load(&a->k, p->dtype, krow + k0, nk, g, D, w->k, &ldk);
        const float *v = ra__tile_load(&a->v, p->dtype, krow + k0, nk, g, Dv, w->v, &ldv);
        ra__tile_logits(p, h, &qs, &ks, delta, kind, w->row_begin, w->row_end, q, ldq, k, ldk,
                        w->s, NULL);
        softmax_tile(w->s, nq, nk, w->m, w->l, w->acc, Dv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nq, Dv, nk, 1.0f, w->s, nk, v,
                    (int)ldv, 1.0f, w->acc, Dv);
    }
    for (int i = 0; i < nq; ++i) {
        float *acc = w->acc + (size_t)i * Dv;
        ra__state_finalize(w->m[i], w->l[i], acc, Dv, acc, &a->lse[h * p->total_q + qrow + i]);
    }
    ra__tile_store(&a->o, p->dtype, qrow, nq, h, Dv, w->acc, Dv);
}

ringattn_status_t ra__cpu_forward(struct ringattn_plan *p, const ra_args *a)
{
    const int nt = ra__cpu_threads(p);
    RA_TRY(ra__cpu_workspace(p, nt));
    const struct ra_workspace *ws = p->ws;
    const int H = p->num_heads;
    const int64_t tasks = ws->q_tiles * H;
    int blas_threads;
    ra__cpu_blas_single_thread_begin(&blas_threads);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t task = 0; task < tasks; ++task) {
        int seq;
        int64_t q0;
        const int nq = ra__tile_rows(ws->q_tile_first, p->cu_q, p->num_seqs, ws->block_q,
                                     task / H, &seq, &q0);
        forward_qtile(p, a, &ws->per_thread[omp_get_thread_num()], seq, (int)(task % H), q0, nq,
                      ws->block_k);
    }
    ra__cpu_blas_single_thread_end(blas_threads);
    return RINGATTN_SUCCESS;
}
