/*
 * The CPU backend's workspace, made at plan creation and kept by the plan: O(threads x tile)
 * floats, the backward prologue's three values per local query row and head (as many as the
 * LSE each); and the backward's partial dK, dV, dBias slots
 * (backward.h), made by the plan's first backward call (issue 28: at T = 32K they were 130 MiB
 * of a forward-only plan).
 */
#include "kernels/cpu/threads.h"
#include <stdlib.h>

#include "base/error.h"
#include "kernels/cpu/cpu.h"

int ra__cpu_threads(const ra_kernel_params *p, const struct ra_workspace *ws)
{
    const int want = p->num_threads > 0 ? p->num_threads : omp_get_max_threads();
    return want < ws->threads ? want : ws->threads;
}

void ra__cpu_workspace_destroy(struct ra_workspace *ws)
{
    if (!ws) return;
    free(ws->per_thread);
    free(ws->drow);
    free(ws->pshift);
    free(ws->pscale);
    free(ws->bwd_dk);
    free(ws->slab);
    free(ws);
}

/* The largest M, N or K of a tile product: the own products' packing buffers hold it. */
static int product_dim(const ra_kernel_params *p)
{
    const int dims[] = {p->block_q, p->block_k, p->keys_block, p->head_dim, p->head_dim_v};
    int m = 1;
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; ++i) m = dims[i] > m ? dims[i] : m;
    return m;
}

/* Carves one thread's buffers out of base (with the own products' packing buffers: bf16,
   f32 as ra__cpu_bf16_products, ra__cpu_f32_products say); returns the number of floats
   used. */
static size_t carve(ra_thread_ws *w, float *base, const ra_kernel_params *p, int bf16, int f32)
{
    const int bq = p->block_q, bk = p->block_k, kb = p->keys_block, d = p->head_dim;
    const int dv = p->head_dim_v, dmax = d > dv ? d : dv, pd = product_dim(p);
    size_t pack_a = 0, pack_b = 0; /* the larger of the two kernels' needs */
    for (int operand = 0; operand < 2; ++operand) {
        const size_t b16 = bf16 ? ra__gemm_bf16_words(pd, operand) : 0;
        const size_t b32 = f32 ? ra__gemm_f32_floats(pd, operand) : 0;
        *(operand ? &pack_b : &pack_a) = b16 > b32 ? b16 : b32;
    }
    const size_t sizes[] = {(size_t)bq * d,    (size_t)bk * d,    (size_t)bk * dv, (size_t)bq * dv,
                            (size_t)bq * dv,   (size_t)bq * bk,   (size_t)bq * bk, (size_t)bq * bk,
                            (size_t)bq * dmax, bq,                bq,              bq,
                            bq,                (size_t)kb * d,    (size_t)kb * dv, 2 * (size_t)kb,
                            kb,                kb,                (size_t)bk * d,  (size_t)bk * dv,
                            bk,                (size_t)bq * d,    pack_a,
                            pack_b};
    float **dst[] = {&w->q,      &w->k,        &w->v,
                     &w->dout,   &w->o,        &w->s,
                     &w->dp,     &w->tanh_s,   &w->acc,
                     &w->m,      &w->l,        (float **)&w->row_begin,
                     (float **)&w->row_end,    &w->kb,
                     &w->vb,     (float **)&w->batch_row,
                     (float **)&w->batch_pos,  &w->batch_bias,
                     &w->dkt,    &w->dvt,      &w->dbt,
                     &w->q_scaled, (float **)&w->pack_a,
                     (float **)&w->pack_b};
    _Static_assert(sizeof sizes / sizeof sizes[0] == sizeof dst / sizeof dst[0],
                   "one size per buffer");
    size_t used = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
        if (base) *dst[i] = base + used;
        used += (sizes[i] + 15) & ~(size_t)15; /* 64-byte aligned buffers */
    }
    if (base) {
        w->bf16 = bf16, w->f32 = f32;
        if (!bf16 && !f32) w->pack_a = w->pack_b = NULL;
    }
    return used;
}

/*
 * The backward's query ranges per sequence (backward.c): enough (sequence, kv head, range)
 * tasks for RA_CPU_BWD_TASKS threads, from the shapes alone (SPEC 9: never the thread count).
 */
static int backward_ranges(const ra_kernel_params *p)
{
    int seqs = 0;
    for (int s = 0; s < p->num_seqs; ++s)
        seqs += p->queries->seq_first[s + 1] > p->queries->seq_first[s];
    const int units = (seqs > 0 ? seqs : 1) * p->num_kv_heads;
    return units >= RA_CPU_BWD_TASKS ? 1 : (RA_CPU_BWD_TASKS + units - 1) / units;
}

/* Sizes ws's backward slots (backward.h) for the plan's largest key shard; returns floats.
   A forward-only plan (a KV cache's) has none: they would be the most of its memory. */
static size_t backward_slots(const ra_kernel_params *p, struct ra_workspace *ws, size_t *dk,
                             size_t *dv)
{
    int64_t tk = 1;
    for (int s = 0; s < p->num_key_shards && !p->forward_only; ++s)
        tk = p->key_shards[s].rows > tk ? p->key_shards[s].rows : tk;
    const int H = p->num_heads, Hk = p->num_kv_heads;
    ws->bwd_ranges = backward_ranges(p);
    ws->bwd_db_rows = p->bias_heads == 0 ? 0 : (p->bias_heads == H && H > Hk ? H : Hk);
    const size_t rows = (size_t)ws->bwd_ranges * (size_t)tk;
    *dk = rows * Hk * p->head_dim;
    *dv = rows * Hk * p->head_dim_v;
    return *dk + *dv + rows * ws->bwd_db_rows + 1;
}

ringattn_status_t ra__cpu_workspace_create(const ra_kernel_params *p, struct ra_workspace **out,
                                           size_t *bytes)
{
    struct ra_workspace *ws = calloc(1, sizeof *ws);
    if (!ws) return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "ringattn: out of memory (workspace)");
    const int threads = ws->threads = p->num_threads;
    const int bf16 = ra__cpu_bf16_products(p->dtype), f32 = ra__cpu_f32_products();
    const size_t per = carve(&(ra_thread_ws){0}, NULL, p, bf16, f32);
    size_t n_dk, n_dv;
    const size_t slots = backward_slots(p, ws, &n_dk, &n_dv);
    const size_t rows = (size_t)p->num_heads * (size_t)p->queries->rows + 1;
    ws->per_thread = calloc((size_t)threads, sizeof *ws->per_thread);
    ws->drow = malloc(rows * sizeof(float));
    ws->pshift = malloc(rows * sizeof(float));
    ws->pscale = malloc(rows * sizeof(float));
    ws->slab = aligned_alloc(64, per * threads * sizeof(float));
    ws->bwd_floats = slots, ws->bwd_dk_floats = n_dk, ws->bwd_dv_floats = n_dv;
    if (!ws->per_thread || !ws->drow || !ws->pshift ||
        !ws->pscale || !ws->slab) {
        ra__cpu_workspace_destroy(ws);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY,
                        "ringattn: out of memory (workspace of %zu bytes)",
                        per * threads * sizeof(float));
    }
    for (int t = 0; t < threads; ++t) {
        ra_thread_ws *w = &ws->per_thread[t];
        carve(w, (float *)ws->slab + per * t, p, bf16, f32);
        w->drow = ws->drow, w->pshift = ws->pshift, w->pscale = ws->pscale;
    }
    *bytes = sizeof *ws + per * threads * sizeof(float) + 3 * rows * sizeof(float) +
             threads * sizeof *ws->per_thread;
    *out = ws;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__cpu_backward_workspace(const ra_kernel_params *p, struct ra_workspace *ws,
                                             size_t *bytes)
{
    (void)p;
    *bytes = 0;
    if (ws->bwd_dk) return RINGATTN_SUCCESS;
    float *slots = malloc(ws->bwd_floats * sizeof(float));
    RA_CHECK(slots != NULL, RINGATTN_ERR_OUT_OF_MEMORY,
             "ringattn_backward: out of memory (the backward's dK/dV slots, %zu bytes, made by "
             "a plan's first backward)",
             ws->bwd_floats * sizeof(float));
    ws->bwd_dk = slots;
    ws->bwd_dv = slots + ws->bwd_dk_floats;
    ws->bwd_db = ws->bwd_dv + ws->bwd_dv_floats;
    *bytes = ws->bwd_floats * sizeof(float);
    return RINGATTN_SUCCESS;
}
