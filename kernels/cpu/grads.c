/*
 * CPU backward, one task (SPEC 7): the query tiles of one query range of one sequence, each
 * with the query heads of one kv head's GQA group in order and the keys each sees (the same
 * pieces as the forward). Every tile pair computes P and dS once and takes 5 products:
 * S = Q K^T, dP = dO V^T, then dQ += dS K, dV += P^T dO, dK += dS^T Q. The task owns the dQ
 * of its rows; its dK, dV (and dBias) go into its own partial slot (backward.h), which the
 * call sums over the ranges in range order afterwards.
 */
#include "kernels/cpu/threads.h"
#include <string.h>

#include "base/call_stream.h"
#include "kernels/cpu/backward.h"

/* The task's partial: dK, dV rows of kv head g and dBias row (NULL without dBias), slot j. */
typedef struct task_sums {
    float *dk, *dv, *db;
} task_sums;

/* Zeroes the task's slot on the key rows of sequence s (every key row belongs to one). */
static void zero_sequence_rows(const ra_kernel_params *p, const ra_bwd_io *io,
                               const ra_bwd_parts *parts, const task_sums *t, int s, int dbr0,
                               int dbr1, int j)
{
    const ra_shard *ks = io->keys;
    const int64_t tk = ks->rows;
    for (int seg = ks->seq_first[s]; seg < ks->seq_first[s + 1]; ++seg) {
        const int64_t r0 = ks->segs[seg].row, n = ks->segs[seg].span.count;
        memset(t->dk + r0 * p->head_dim, 0, (size_t)n * p->head_dim * sizeof(float));
        memset(t->dv + r0 * p->head_dim_v, 0, (size_t)n * p->head_dim_v * sizeof(float));
        for (int r = dbr0; t->db && r < dbr1; ++r)
            memset(ra__bwd_slot_db(parts, j, r, tk) + r0, 0, (size_t)n * sizeof(float));
    }
}

/* dQ += scale dZ K (the nk keys' K rows at k), and their dV = P^T dO, dK = scale dZ^T Q added
   to rows dk, dv (beta 1) or written there (beta 0). */
static void pair_products(const ra_kernel_params *p, ra_thread_ws *w, const ra_q_side *qd,
                          int nq, int nk, const float *k, int64_t ldk, float *dk, float *dv,
                          float beta)
{
    const int D = p->head_dim, Dv = p->head_dim_v;
    const ra_rounding r = ra__p_rounding(p); /* P and dS: see ra_rounding */
    ra__cpu_gemm(w, r, 0, 0, nq, D, nk, p->scale, w->dp, nk, k, ldk, 1.0f, w->acc, D);
    ra__cpu_gemm(w, r, 1, 0, nk, Dv, nq, 1.0f, w->s, nk, qd->dout, qd->lddo, beta, dv, Dv);
    ra__cpu_gemm(w, r, 1, 0, nk, D, nq, p->scale, w->dp, nk, qd->q, qd->ldq, beta, dk, D);
}

/* A gathered batch of keys (SPEC 6 selection): its sums computed apart, then added to the
   keys' rows of the task's partial. */
static void batch_pair(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                       const ra_span *qs, int h, int g, const ra_q_side *qd,
                       const ra_key_batch *b, const ra_tile_dyn *sel, const task_sums *t)
{
    const int D = p->head_dim, Dv = p->head_dim_v, nq = (int)qs->count;
    ra__batch_gather(p, io->k, io->v, g, b, w->kb, w->vb);
    ra__batch_logits(p, w, h, qs, b, &qd->logits_q, ra__tanh_buf(p, w), sel);
    if (t->db) memset(w->dbt, 0, (size_t)b->n * sizeof *w->dbt);
    ra__tile_grads(p, w, nq, b->n, qd, w->vb, Dv, t->db ? w->dbt : NULL);
    pair_products(p, w, qd, nq, b->n, w->kb, D, w->dkt, w->dvt, 0.0f);
    for (int c = 0; c < b->n; ++c) {
        ra__cpu_add_floats(t->dk + b->row[c] * D, w->dkt + (size_t)c * D, (size_t)D);
        ra__cpu_add_floats(t->dv + b->row[c] * Dv, w->dvt + (size_t)c * Dv, (size_t)Dv);
        if (t->db) t->db[b->row[c]] += w->dbt[c];
    }
}

/* Query tile `item` of the held shard's tile list (qs, local rows from qrow) of head h against
   every key it sees; dQ in w->acc. */
static void query_tile(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                       const ra_tile_list *list, int32_t item, const ra_span *qs, int64_t qrow,
                       int h, int g, const task_sums *t)
{
    const int D = p->head_dim, Dv = p->head_dim_v, nq = (int)qs->count;
    int64_t ldk, ldv;
    const ra_q_side qd = ra__load_q_side(p, io, w, h, qrow, nq);
    memset(w->acc, 0, (size_t)nq * D * sizeof *w->acc);
    ra_key_pieces pieces;
    ra__pieces_begin(&pieces, p, &io->dyn, w, list, item, qs, qrow, io->keys, h);
    for (ra_piece piece; (piece = ra__pieces_next(&pieces)) != RA_PIECE_END;) {
        if (piece == RA_PIECE_BATCH) {
            batch_pair(p, io, w, qs, h, g, &qd, &pieces.batch, &pieces.sel, t);
            continue;
        }
        const int nk = (int)pieces.ks.count;
        const int64_t kr = pieces.krow;
        const float *k = ra__tile_load(io->k, p->dtype, kr, nk, g, D, w->k, &ldk);
        const float *v = ra__tile_load(io->v, p->dtype, kr, nk, g, Dv, w->v, &ldv);
        ra__tile_logits(p, w, h, qs, &pieces.ks, p->delta[qs->seq], pieces.kind, &qd.logits_q, k,
                        ldk, ra__tanh_buf(p, w), pieces.use);
        ra__tile_grads(p, w, nq, nk, &qd, v, ldv, t->db ? t->db + kr : NULL);
        pair_products(p, w, &qd, nq, nk, k, ldk, t->dk + kr * D, t->dv + kr * Dv, 1.0f);
    }
    ra__tile_store(io->dq, p->dtype, io->accumulate, qrow, nq, h, D, w->acc, D);
}

void ra__grads_task(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                    const ra_bwd_parts *parts, int s, int g, int j)
{
    const int G = p->num_heads / p->num_kv_heads, J = parts->ranges;
    const int64_t tk = io->keys->rows;
    /* dBias rows: one per query head when every head has its own bias head, else one per kv
       head (H_b = H_kv, or H_b = 1 summed over the kv heads afterwards) */
    const int per_head = parts->db_rows > p->num_kv_heads;
    const int dbr0 = per_head ? g * G : g, dbr1 = per_head ? dbr0 + G : g + 1;
    task_sums t = {ra__bwd_slot_dk(parts, j, g, tk), ra__bwd_slot_dv(parts, j, g, tk), NULL};
    if (io->dyn.dbias) t.db = ra__bwd_slot_db(parts, j, dbr0, tk);
    zero_sequence_rows(p, io, parts, &t, s, dbr0, dbr1, j);

    const ra_shard *qsh = p->queries;
    const ra_tile_list *list = ra__key_tiles(p, io->keys); /* its items in tile order */
    const int64_t t0 = list->seg_item[qsh->seq_first[s]];
    const int64_t n = list->seg_item[qsh->seq_first[s + 1]] - t0;
    for (int64_t tile = t0 + n * j / J; tile < t0 + n * (j + 1) / J; ++tile) {
        ra_span qs;
        int64_t qrow;
        ra__tile_item_span(list, qsh, (int32_t)tile, &qs, &qrow);
        for (int h = g * G; h < (g + 1) * G; ++h) {
            if (io->dyn.dbias && per_head) t.db = ra__bwd_slot_db(parts, j, h, tk);
            query_tile(p, io, w, list, (int32_t)tile, &qs, qrow, h, g, &t);
        }
        if (omp_get_thread_num() == 0) ra__call_stream_poll(io->stream);
    }
}
