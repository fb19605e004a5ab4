/*
 * CPU forward: one (query tile, head) per task, key tiles streamed through the guarded online
 * softmax of SPEC 4. Loop bounds come from the mask hull and EMPTY tiles are skipped, so a
 * window of W costs O(T * W). Each row's reduction order is fixed: results do not depend on
 * the thread count or timing.
 */
#include <math.h>
#include "kernels/cpu/threads.h"

#include "base/error.h"
#include "base/call_stream.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/isa.h"
#include "kernels/softmax_state.h"

/*
 * SPEC 4 on the rows of one tile: s becomes p = exp(s - m_new) in place. A row that has seen no
 * allowed key yet (guard) keeps its state and gets p = 0, so the PV product adds nothing.
 */
RA_CPU_CLONES static void softmax_tile(float *s, int nq, int nk, float *m, float *l, float *acc,
                                       int dv)
{
    for (int i = 0; i < nq; ++i) {
        float *row = s + (size_t)i * nk;
        float mb = -INFINITY, alpha, sum = 0.0f;
#pragma omp simd reduction(max : mb)
        for (int j = 0; j < nk; ++j) mb = row[j] > mb ? row[j] : mb;
        mb = ra__block_max_or_nan(row, nk, mb);
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

/* Columns of the running acc: D_v, or none in the SPEC 9 stats pass (only m and l are kept). */
static int acc_dim(const ra_kernel_params *p, const ra_fwd_io *io)
{
    return io->stats_only ? 0 : p->head_dim_v;
}

/* Running state of rows [row, row + nq) of head h: from the io's arrays, or fresh (SPEC 4). */
static void state_begin(const ra_kernel_params *p, const ra_fwd_io *io, ra_thread_ws *w, int h,
                        int64_t row, int nq)
{
    const int Dv = acc_dim(p, io), H = p->num_heads;
    const int64_t rows = p->queries->rows;
    for (int i = 0; i < nq; ++i) {
        float *acc = w->acc + (size_t)i * Dv;
        if (io->first) {
            ra__state_init(&w->m[i], &w->l[i], acc, Dv);
            continue;
        }
        w->m[i] = io->m[h * rows + row + i];
        w->l[i] = io->l[h * rows + row + i];
        const float *src = io->acc + ((row + i) * H + h) * (int64_t)Dv;
        for (int c = 0; c < Dv; ++c) acc[c] = src[c];
    }
}

/* Finalise into O and LSE (last step), or keep the state for the next step. */
static void state_end(const ra_kernel_params *p, const ra_fwd_io *io, ra_thread_ws *w, int h,
                      int64_t row, int nq)
{
    const int Dv = acc_dim(p, io), H = p->num_heads;
    const int64_t rows = p->queries->rows;
    const int finalise = io->last && !io->stats_only;
    for (int i = 0; i < nq; ++i) {
        float *acc = w->acc + (size_t)i * Dv;
        if (finalise) {
            ra__state_finalize(w->m[i], w->l[i], io->sinks ? io->sinks[h] : -INFINITY, acc, Dv,
                               acc, &io->lse[h * rows + row + i]);
            continue;
        }
        io->m[h * rows + row + i] = w->m[i];
        io->l[h * rows + row + i] = w->l[i];
        float *dst = io->acc + ((row + i) * H + h) * (int64_t)Dv;
        for (int c = 0; c < Dv; ++c) dst[c] = acc[c];
    }
    if (finalise) ra__tile_store(io->o, p->dtype, 0, row, nq, h, Dv, w->acc, Dv);
}

/* Logits of the query tile against a batch of gathered keys, then SPEC 4 and PV. */
static void forward_batch(const ra_kernel_params *p, const ra_fwd_io *io, ra_thread_ws *w,
                          const ra_span *qs, const ra_qtile *q, int h, const ra_key_batch *b,
                          const ra_tile_dyn *dyn)
{
    const int Dv = acc_dim(p, io), g = h / (p->num_heads / p->num_kv_heads);
    ra__batch_gather(p, io->k, io->v, g, b, w->kb, w->vb);
    ra__batch_logits(p, w, h, qs, b, q, NULL, dyn);
    softmax_tile(w->s, (int)qs->count, b->n, w->m, w->l, w->acc, Dv);
    if (!io->stats_only)
        ra__cpu_gemm(w, ra__p_rounding(p), 0, 0, (int)qs->count, Dv, b->n, 1.0f, w->s, b->n, w->vb,
                     Dv, 1.0f, w->acc, Dv);
}

/* Query tile `item` of the held shard's tile list (qs, local rows from qrow) of head h against
   every key tile it meets. */
static void forward_qtile(const ra_kernel_params *p, const ra_fwd_io *io, ra_thread_ws *w,
                          const ra_tile_list *list, int32_t item, const ra_span *qs,
                          int64_t qrow, int h)
{
    const int D = p->head_dim, g = h / (p->num_heads / p->num_kv_heads);
    const int Dv = acc_dim(p, io), nq = (int)qs->count;
    int64_t ldq, ldk, ldv;
    const float *q_in = ra__tile_load(io->q, p->dtype, qrow, nq, h, D, w->q, &ldq);
    const ra_qtile q = ra__qtile(p, q_in, ldq, nq, io->scale_q_first, w->q_scaled);
    state_begin(p, io, w, h, qrow, nq);
    ra_key_pieces pieces;
    ra__pieces_begin(&pieces, p, &io->dyn, w, list, item, qs, qrow, io->keys, h);
    for (ra_piece piece; (piece = ra__pieces_next(&pieces)) != RA_PIECE_END;) {
        if (piece == RA_PIECE_BATCH) {
            forward_batch(p, io, w, qs, &q, h, &pieces.batch, &pieces.sel);
            continue;
        }
        const int nk = (int)pieces.ks.count;
        const float *k = ra__tile_load(io->k, p->dtype, pieces.krow, nk, g, D, w->k, &ldk);
        ra__tile_logits(p, w, h, qs, &pieces.ks, p->delta[qs->seq], pieces.kind, &q, k, ldk, NULL,
                        pieces.use);
        softmax_tile(w->s, nq, nk, w->m, w->l, w->acc, Dv);
        if (io->stats_only) continue;
        const float *v = ra__tile_load(io->v, p->dtype, pieces.krow, nk, g, Dv, w->v, &ldv);
        /* P rounded to bfloat16 where the products are bfloat16, or in two parts (ra_rounding) */
        ra__cpu_gemm(w, ra__p_rounding(p), 0, 0, nq, Dv, nk, 1.0f, w->s, nk, v, ldv, 1.0f, w->acc,
                     Dv);
    }
    state_end(p, io, w, h, qrow, nq);
}

/* SPEC 9 stats pass: does a row of the tile (rows [qrow, qrow + nq) of head h) need them? */
static int tile_needs_stats(const ra_kernel_params *p, const ra_fwd_io *io, int h, int64_t qrow,
                            int nq)
{
    const float *lse = io->lse + h * p->queries->rows + qrow;
    for (int i = 0; i < nq; ++i)
        if (ra__lse_lossy(lse[i])) return 1;
    return 0;
}

ringattn_status_t ra__cpu_attend_forward(struct ra_workspace *ws, const ra_kernel_params *p,
                                         const ra_fwd_io *io)
{
    const int nt = ra__cpu_threads(p, ws);
    (void)nt; /* the pragma's: unused in a build without OpenMP */
    const ra_tile_list *list = ra__key_tiles(p, io->keys);
    const int H = p->num_heads;
    const int64_t tasks = (int64_t)list->num_items * H;
    int blas_threads;
    ra__cpu_blas_single_thread_begin(&blas_threads);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t task = 0; task < tasks; ++task) { /* the heaviest query tiles first */
        ra_span qs;
        int64_t qrow;
        const int h = (int)(task % H);
        const int32_t item = list->order[task / H];
        ra__tile_item_span(list, p->queries, item, &qs, &qrow);
        if (!io->stats_only || tile_needs_stats(p, io, h, qrow, (int)qs.count))
            forward_qtile(p, io, &ws->per_thread[omp_get_thread_num()], list, item, &qs, qrow, h);
        if (omp_get_thread_num() == 0) ra__call_stream_poll(io->stream);
    }
    ra__cpu_blas_single_thread_end(blas_threads);
    return RINGATTN_SUCCESS;
}
