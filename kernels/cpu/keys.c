/*
 * CPU backward, keys pass (SPEC 7): one (key tile, kv heads) per task sums dK, dV (and dBias)
 * over every query head of its GQA group and every query tile that can see it, so each of
 * those outputs has one owner task and no reduction depends on thread timing. With a top-k
 * selection (SPEC 6) the key tile is taken in order of bias (keys_topk).
 */
#include <cblas.h>
#include <string.h>

#include "kernels/cpu/backward.h"

/*
 * dK, dV (and dBias) of the query tile qs of head h, (query side qd), on the keys of tile ks
 * through the tile walk's current pair: added into w->dk, w->dv (and dbias when not NULL).
 */
static void keys_pair(const ra_kernel_params *p, ra_thread_ws *w, const ra_span *qs,
                      const ra_span *ks, ra_block_kind kind, const ra_q_side *qd, int h,
                      const float *k, int64_t ldk, const float *v, int64_t ldv,
                      const ra_tile_dyn *dyn, float *dbias)
{
    const int nq = (int)qs->count, nk = (int)ks->count;
    ra__tile_logits(p, h, qs, ks, p->delta[qs->seq], kind, w->row_begin, w->row_end,
                    &qd->logits_q, k, ldk, w->s, ra__tanh_buf(p, w), dyn);
    ra__tile_grads(p, w, nq, nk, qd, v, ldv, dbias);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, p->head_dim_v, nq, 1.0f, w->s, nk,
                qd->dout, (int)qd->lddo, 1.0f, w->dv, p->head_dim_v);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, p->head_dim, nq, p->scale, w->dp, nk,
                qd->q, (int)qd->ldq, 1.0f, w->dk, p->head_dim);
}

/*
 * dK, dV and dBias of a batch of keys (K, V rows in kb, vb) for the query tile qs of head h:
 * dk = beta * dk + dS^T Q, dv likewise, and dBias column sums added to db (when not NULL).
 */
static void keys_slice(const ra_kernel_params *p, ra_thread_ws *w, const ra_span *qs,
                       const ra_q_side *qd, int h, const ra_key_batch *b, const float *kb,
                       const float *vb, float *dk, float *dv, float *db, float beta,
                       const ra_tile_dyn *dyn)
{
    const int D = p->head_dim, Dv = p->head_dim_v, nq = (int)qs->count;
    ra__batch_logits(p, h, qs, b, &qd->logits_q, kb, w->s, ra__tanh_buf(p, w), dyn);
    ra__tile_grads(p, w, nq, b->n, qd, vb, Dv, db);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, b->n, Dv, nq, 1.0f, w->s, b->n, qd->dout,
                (int)qd->lddo, beta, dv, Dv);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, b->n, D, nq, p->scale, w->dp, b->n,
                qd->q, (int)qd->ldq, beta, dk, D);
}

/* Adds row `from` of the key sums (sk, sv, sb) to row `to` of (dk, dv, db); sb, db: NULL or
   both given. */
static void add_key_sums(const ra_kernel_params *p, float *restrict dk, float *restrict dv,
                         float *restrict db, int64_t to, const float *restrict sk,
                         const float *restrict sv, const float *restrict sb, int64_t from)
{
    const int D = p->head_dim, Dv = p->head_dim_v;
    for (int c = 0; c < D; ++c) dk[to * D + c] += sk[from * D + c];
    for (int c = 0; c < Dv; ++c) dv[to * Dv + c] += sv[from * Dv + c];
    if (db) db[to] += sb[from];
}

/*
 * keys_slice for the first n keys of the sorted tile `all` that query tile qs may see, for a
 * query tile that sees only slots [lo, hi) of the key tile (near the causal diagonal or a
 * window's edge): those keys are gathered in batches of up to bk and their sums added back at
 * their sorted index. (Computing the whole prefix would spend a sixth of the keys pass, at
 * T = 16K with keep_k = T/8, on keys the query tile cannot see.)
 */
static void keys_part(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                      const ra_span *qs, const ra_q_side *qd, int g, int h, const ra_key_batch *all,
                      int n, int64_t lo, int64_t hi, const ra_tile_dyn *dyn, int with_dbias,
                      int bk)
{
    ra_key_batch b = {0, w->part_row, w->part_pos, w->part_bias, w->part_slot};
    for (int j = 0; j < n; ++j) {
        if (all->slot[j] >= lo && all->slot[j] < hi) {
            b.row[b.n] = all->row[j];
            b.pos[b.n] = all->pos[j];
            b.bias[b.n] = all->bias[j];
            b.slot[b.n++] = j; /* the sorted index its sums go back to */
        }
        if (b.n < bk && (j + 1 < n || b.n == 0)) continue;
        ra__batch_gather(p, io->k, io->v, g, &b, w->k, w->v);
        if (with_dbias) memset(w->dbt, 0, (size_t)b.n * sizeof *w->dbt);
        keys_slice(p, w, qs, qd, h, &b, w->k, w->v, w->dkt, w->dvt, with_dbias ? w->dbt : NULL,
                   0.0f, dyn);
        for (int c = 0; c < b.n; ++c)
            add_key_sums(p, w->dkb, w->dvb, with_dbias ? w->dbb : NULL, b.slot[c], w->dkt, w->dvt,
                         w->dbt, c);
        b.n = 0;
    }
}

/*
 * The keys pass's walk over the query tiles that see key tile ks (local rows from krow), for
 * query head h: each next one has some row that keeps some key (SPEC 3 and SPEC 6 skipping);
 * its dynamic-mask view is in dyn / use.
 */
typedef struct query_tiles {
    ra_tile_walk walk;
    ra_span qs;
    int64_t qrow;
    ra_block_kind kind;
    ra_tile_dyn dyn;
    const ra_tile_dyn *use;
} query_tiles;

static void query_tiles_begin(query_tiles *t, const ra_kernel_params *p, const ra_bwd_io *io,
                              ra_thread_ws *w, const ra_span *ks, int bq)
{
    ra__walk_begin(&t->walk, p, ks, 0, p->queries, bq, w->row_begin, w->row_end);
}

static int query_tiles_next(query_tiles *t, const ra_kernel_params *p, const ra_bwd_io *io,
                            int h, const ra_span *ks, int64_t krow)
{
    while (ra__walk_next(&t->walk, &t->qs, &t->qrow, &t->kind))
        if (ra__tile_dyn(p, &io->dyn, h, t->qrow, (int)t->qs.count, p->queries->rows, krow,
                         (int)ks->count, &t->dyn, &t->use))
            return 1;
    return 0;
}

/* The key tile ks (local rows from krow) in order of bias, descending: w->order, the batch
   arrays, and K, V of kv head g in w->kb, w->vb. */
static ra_key_batch keys_by_bias(const ra_kernel_params *p, const ra_bwd_io *io,
                                 ra_thread_ws *w, const ra_span *ks, int64_t krow, int g,
                                 const float *bias)
{
    ra_key_batch all = ra__batch_of(w);
    ra__topk_order(bias, (int32_t)ks->count, w->order);
    for (int i = 0; i < (int)ks->count; ++i)
        ra__batch_add_key(&all, ks, krow, bias, w->order[i].pos);
    ra__batch_gather(p, io->k, io->v, g, &all, w->kb, w->vb);
    return all;
}

/* How many of the n biases (descending) reach t. */
static int count_reaching(const float *desc, int n, float t)
{
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (desc[mid] >= t) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/*
 * Keys pass with a top-k selection (SPEC 6), for kv head g and the query heads [h0, h1) of its
 * group that share bias head hb: the key tile is sorted by bias once, so the keys that some row
 * of a query tile may keep (bias >= its lowest threshold) are a prefix of it, computed in
 * slices of block_k without gathering per query tile. The sums, kept in sorted order, are
 * added to the tile's dK, dV (w->dk, w->dv) and dBias row at the end.
 */
static void keys_topk(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                      const ra_span *ks, int64_t krow, int g, int h0, int h1, int hb,
                      float *dbias, int bq, int bk)
{
    const int D = p->head_dim, Dv = p->head_dim_v, nk = (int)ks->count;
    const float *bias = io->dyn.bias + hb * io->dyn.ld + krow;
    const ra_key_batch all = keys_by_bias(p, io, w, ks, krow, g, bias);
    memset(w->dkb, 0, (size_t)nk * D * sizeof *w->dkb);
    memset(w->dvb, 0, (size_t)nk * Dv * sizeof *w->dvb);
    memset(w->dbb, 0, (size_t)nk * sizeof *w->dbb);
    int used = 0;
    for (int h = h0; h < h1; ++h) {
        query_tiles t;
        query_tiles_begin(&t, p, io, w, ks, bq);
        while (query_tiles_next(&t, p, io, h, ks, krow)) {
            const ra_span *qs = &t.qs;
            const int nq = (int)qs->count;
            const int n = count_reaching(all.bias, nk, t.use->tmin);
            if (n == 0) continue;
            const ra_q_side qd = ra__load_q_side(p, io, w, h, t.qrow, nq);
            int64_t lo, hi; /* the slots of the key tile that some row of qs may see */
            ra__key_hull(p->window, p->delta[qs->seq], qs, ks, &lo, &hi);
            if (lo > 0 || hi < nk) {
                keys_part(p, io, w, qs, &qd, g, h, &all, n, lo, hi, t.use, dbias != NULL, bk);
            } else {
                for (int at = 0; at < n; at += bk) {
                    const ra_key_batch slice = {n - at < bk ? n - at : bk, all.row + at,
                                                all.pos + at, all.bias + at, all.slot + at};
                    keys_slice(p, w, qs, &qd, h, &slice, w->kb + at * D, w->vb + at * Dv,
                               w->dkb + at * D, w->dvb + at * Dv, dbias ? w->dbb + at : NULL,
                               1.0f, t.use);
                }
            }
            used = n > used ? n : used;
        }
    }
    for (int j = 0; j < used; ++j) /* back to tile order */
        add_key_sums(p, w->dk, w->dv, dbias, all.slot[j], w->dkb, w->dvb, w->dbb, j);
}

/* The keys pass's task (backward.h). */
void ra__keys_task(const ra_kernel_params *p, const ra_bwd_io *io, ra_thread_ws *w,
                   const ra_span *ks, int64_t krow, int g0, int g1)
{
    const int bq = p->block_q, bk = p->block_k;
    const int D = p->head_dim, Dv = p->head_dim_v, G = p->num_heads / p->num_kv_heads;
    const int nk = (int)ks->count, Hb = p->bias_heads;
    const int per_bias = Hb ? p->num_heads / Hb : 1;
    float *const dbias = io->dyn.dbias ? w->dbias : NULL; /* [H_b, nk] */
    if (dbias) memset(dbias, 0, (size_t)Hb * nk * sizeof *dbias);
    const int select = io->dyn.thr_b != NULL; /* keys taken in order of bias instead */
    int64_t ldk = 0, ldv = 0;
    for (int g = g0; g < g1; ++g) {
        memset(w->dk, 0, (size_t)nk * D * sizeof *w->dk);
        memset(w->dv, 0, (size_t)nk * Dv * sizeof *w->dv);
        if (select) {
            for (int h0 = g * G, h1; h0 < (g + 1) * G; h0 = h1) { /* heads sharing a bias head */
                const int hb = h0 / per_bias;
                h1 = (hb + 1) * per_bias < (g + 1) * G ? (hb + 1) * per_bias : (g + 1) * G;
                keys_topk(p, io, w, ks, krow, g, h0, h1, hb, dbias ? dbias + (size_t)hb * nk : NULL,
                          bq, bk);
            }
        } else {
            const float *k = ra__tile_load(io->k, p->dtype, krow, nk, g, D, w->k, &ldk);
            const float *v = ra__tile_load(io->v, p->dtype, krow, nk, g, Dv, w->v, &ldv);
            for (int h = g * G; h < (g + 1) * G; ++h) {
                query_tiles t;
                query_tiles_begin(&t, p, io, w, ks, bq);
                while (query_tiles_next(&t, p, io, h, ks, krow)) {
                    const ra_q_side qd = ra__load_q_side(p, io, w, h, t.qrow, (int)t.qs.count);
                    keys_pair(p, w, &t.qs, ks, t.kind, &qd, h, k, ldk, v, ldv, t.use,
                              dbias ? dbias + (size_t)(h / per_bias) * nk : NULL);
                }
            }
        }
        ra__tile_store(io->dk, p->dtype, io->accumulate, krow, nk, g, D, w->dk, D);
        ra__tile_store(io->dv, p->dtype, io->accumulate, krow, nk, g, Dv, w->dv, Dv);
    }
    if (!dbias) return;
    const ra_view out = {(char *)io->dyn.dbias, 1, io->dyn.ld, sizeof(float)}; /* [H_b, ld] */
    for (int hb = g0 * G / per_bias; hb <= (g1 * G - 1) / per_bias; ++hb)
        ra__tile_store(&out, RINGATTN_FLOAT32, io->accumulate, krow, 1, hb, nk,
                       dbias + (size_t)hb * nk, nk);
}
