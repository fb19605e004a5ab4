/* The packed shard's layout and the ring driver's buffers (see buffers.h). */
#include <stdlib.h>

#include "base/error.h"
#include "plan/buffers.h"
#include "plan/plan.h"

size_t ra__packed_kv_bytes(const struct ringattn_plan *p, int64_t rows)
{
    const ra_kernel_params *k = &p->kp;
    return (size_t)rows * k->num_kv_heads * (size_t)(k->head_dim + k->head_dim_v) *
           ra__dtype_size(k->dtype);
}

size_t ra__packed_sums_bytes(const struct ringattn_plan *p, int64_t rows)
{
    const ra_kernel_params *k = &p->kp;
    const size_t per_row = (size_t)k->num_kv_heads * (k->head_dim + k->head_dim_v) + k->bias_heads;
    return (size_t)rows * per_row * sizeof(float);
}

/* K then V of `rows` rows in `elem`-byte elements at buf. */
static void kv_views(const ra_kernel_params *k, void *buf, int64_t rows, size_t elem, ra_view *kv,
                     ra_view *vv)
{
    const int64_t hk = k->num_kv_heads;
    *kv = (ra_view){buf, hk * k->head_dim, k->head_dim, elem};
    *vv = (ra_view){(char *)buf + (size_t)(rows * hk * k->head_dim) * elem, hk * k->head_dim_v,
                    k->head_dim_v, elem};
}

void ra__packed_kv_views(const struct ringattn_plan *p, void *buf, int64_t rows, ra_view *k,
                         ra_view *v)
{
    kv_views(&p->kp, buf, rows, ra__dtype_size(p->kp.dtype), k, v);
}

void ra__packed_sums_views(const struct ringattn_plan *p, void *buf, int64_t rows, ra_view *dk,
                           ra_view *dv, float **dbias)
{
    const ra_kernel_params *k = &p->kp;
    kv_views(k, buf, rows, sizeof(float), dk, dv);
    *dbias = (float *)buf + rows * k->num_kv_heads * (int64_t)(k->head_dim + k->head_dim_v);
}

ringattn_status_t ra__buffer_backend(const struct ringattn_plan *p, ra_buffers *b, size_t bytes,
                                     void **out)
{
    *out = NULL;
    if (!bytes) return RINGATTN_SUCCESS;
    RA_TRY(p->be->memory->alloc(bytes, out));
    b->bytes += bytes;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__buffer_host(ra_buffers *b, size_t bytes, void **out)
{
    *out = NULL;
    if (!bytes) return RINGATTN_SUCCESS;
    *out = malloc(bytes);
    RA_CHECK(*out != NULL, RINGATTN_ERR_OUT_OF_MEMORY,
             "ringattn_plan_create: out of memory (%zu bytes of ring buffers)", bytes);
    b->host_bytes += bytes;
    return RINGATTN_SUCCESS;
}

static ringattn_status_t make_all(struct ringattn_plan *p, ra_buffers *b)
{
    const ra_kernel_params *k = &p->kp;
    const int ring = p->ranks > 1, Hb = k->bias_heads;
    const size_t H = (size_t)k->num_heads, rows = (size_t)k->queries->rows;
    const size_t dmax = (size_t)(k->head_dim > k->head_dim_v ? k->head_dim : k->head_dim_v);
    const size_t T = (size_t)p->cu_q[k->num_seqs], local_keys = (size_t)ra__local_keys(p)->rows;
    size_t kv = 0, sums = 0;
    for (int r = 0; ring && r < p->ranks; ++r) {
        const size_t a = ra__packed_kv_bytes(p, p->shards[r].rows);
        const size_t s = ra__packed_sums_bytes(p, p->shards[r].rows);
        kv = a > kv ? a : kv;
        sums = s > sums ? s : sums;
    }
    for (int i = 0; i < 2; ++i) {
        RA_TRY(ra__buffer_backend(p, b, kv, &b->kv[i]));
        RA_TRY(ra__buffer_backend(p, b, sums, &b->sums[i]));
    }
    const size_t own = ring ? ra__packed_sums_bytes(p, (int64_t)rows) : 0;
    RA_TRY(ra__buffer_backend(p, b, own, &b->own_part));
    RA_TRY(ra__buffer_backend(p, b, own, &b->returned));
    RA_TRY(ra__buffer_backend(p, b, H * rows * sizeof(float), (void **)&b->m));
    RA_TRY(ra__buffer_backend(p, b, H * rows * sizeof(float), (void **)&b->l));
    RA_TRY(ra__buffer_backend(p, b, ring ? rows * H * dmax * sizeof(float) : 0, (void **)&b->acc));
    RA_TRY(ra__buffer_backend(p, b, ring ? Hb * T * sizeof(float) : 0, (void **)&b->bias));
    const size_t thr = k->selects ? (size_t)Hb * rows : 0;
    RA_TRY(ra__buffer_backend(p, b, thr * sizeof(float), (void **)&b->thr_b));
    RA_TRY(ra__buffer_backend(p, b, thr * sizeof(int64_t), (void **)&b->thr_p));
    RA_TRY(ra__buffer_host(b, Hb * local_keys * sizeof(float), (void **)&b->host_own_bias));
    RA_TRY(ra__buffer_host(b, ring ? Hb * T * sizeof(float) : 0, (void **)&b->host_bias));
    RA_TRY(ra__buffer_host(b, ring && k->selects ? Hb * T * sizeof(float) : 0,
                    (void **)&b->host_global));
    RA_TRY(ra__buffer_host(b, (size_t)p->num_steps, (void **)&b->run));
    return ra__buffers_bias_layout(p, b, ring, 0);
}

ringattn_status_t ra__buffers_bias_layout(const struct ringattn_plan *p, ra_buffers *b,
                                          int gathered, int64_t last_extra)
{
    RA_TRY(ra__buffer_host(b, ((size_t)p->ranks + 1) * sizeof(int64_t), (void **)&b->bias_at));
    RA_TRY(ra__buffer_host(b, (size_t)p->ranks * sizeof(size_t), (void **)&b->bias_bytes));
    b->bias_at[0] = 0;
    for (int r = 0; r < p->ranks; ++r) {
        const int64_t rows = gathered ? p->shards[r].rows + (r == p->ranks - 1 ? last_extra : 0) : 0;
        b->bias_at[r + 1] = b->bias_at[r] + (int64_t)p->kp.bias_heads * rows;
        b->bias_bytes[r] = (size_t)(b->bias_at[r + 1] - b->bias_at[r]) * sizeof(float);
    }
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__buffers_make(struct ringattn_plan *p)
{
    ra_buffers *b = calloc(1, sizeof *b);
    RA_CHECK(b != NULL, RINGATTN_ERR_OUT_OF_MEMORY, "ringattn_plan_create: out of memory");
    p->buf = b;
    return make_all(p, b); /* on failure the plan frees what was made */
}

void ra__buffers_free(struct ringattn_plan *p)
{
    ra_buffers *b = p->buf;
    if (!b) return;
    void *dev[] = {b->kv[0], b->kv[1], b->sums[0], b->sums[1], b->own_part, b->returned,
                   b->m,     b->l,     b->acc,     b->bias,    b->thr_b,    b->thr_p,
                   b->parts, b->q_packed};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; ++i)
        if (dev[i]) p->be->memory->free(dev[i]);
    free(b->host_own_bias);
    free(b->host_bias);
    free(b->host_global);
    free(b->bias_at);
    free(b->bias_bytes);
    free(b->run);
    free(b->host_q);
    free(b);
    p->buf = NULL;
}
