/* Tile loads, stores and logits shared by the CPU forward and backward passes. */
#include <cblas.h>
#include <math.h>

#include "kernels/cpu/cpu.h"
#include "kernels/dtype.h"

const float *ra__tile_load(const ra_view *v, ringattn_dtype_t dt, int64_t row0, int n, int h,
                           int dim, float *buf, int64_t *ld)
{
    if (dt == RINGATTN_FLOAT32) {
        *ld = v->row;
        return (const float *)ra__view_at(v, row0, h);
    }
    for (int i = 0; i < n; ++i) {
        const uint16_t *src = (const uint16_t *)ra__view_at(v, row0 + i, h);
        float *dst = buf + (size_t)i * dim;
        if (dt == RINGATTN_FLOAT16)
            for (int c = 0; c < dim; ++c) dst[c] = ra__f16_to_f32(src[c]);
        else
            for (int c = 0; c < dim; ++c) dst[c] = ra__bf16_to_f32(src[c]);
    }
    *ld = dim;
    return buf;
}

void ra__tile_store(const ra_view *v, ringattn_dtype_t dt, int accumulate, int64_t row0, int n,
                    int h, int dim, const float *src, int64_t ld)
{
    for (int i = 0; i < n; ++i) {
        const float *s = src + (size_t)i * ld;
        void *dst = ra__view_at(v, row0 + i, h);
        if (accumulate) {
            float *d = dst;
            for (int c = 0; c < dim; ++c) d[c] += s[c];
        } else if (dt == RINGATTN_FLOAT32) {
            float *d = dst;
            for (int c = 0; c < dim; ++c) d[c] = s[c];
        } else if (dt == RINGATTN_FLOAT16) {
            uint16_t *d = dst;
            for (int c = 0; c < dim; ++c) d[c] = ra__f32_to_f16(s[c]);
        } else {
            uint16_t *d = dst;
            for (int c = 0; c < dim; ++c) d[c] = ra__f32_to_bf16(s[c]);
        }
    }
}

/* SPEC 2: z = softcap * tanh(z / softcap); the tanh values are the backward's derivative. */
static void softcap_row(float *s, float *t, int n, float cap)
{
    const float inv = 1.0f / cap;
    for (int j = 0; j < n; ++j) {
        const float th = tanhf(s[j] * inv);
        if (t) t[j] = th;
        s[j] = cap * th;
    }
}

/* SPEC 2: s -= slope * |p_i + delta - p_j| over keys at kpos, kpos + kstride, ... */
static void alibi_row(float *s, int n, float slope, int64_t qpos_delta, int64_t kpos,
                      int64_t kstride)
{
    for (int j = 0; j < n; ++j) {
        const int64_t dist = qpos_delta - (kpos + j * kstride);
        s[j] -= slope * (float)(dist < 0 ? -dist : dist);
    }
}

void ra__tile_logits(const struct ringattn_plan *p, int h, const ra_span *qs, const ra_span *ks,
                     int64_t delta, ra_block_kind kind, const int32_t *row_begin,
                     const int32_t *row_end, const float *q, int64_t ldq, const float *k,
                     int64_t ldk, float *s, float *tanh_s)
{
    const int nq = (int)qs->count, nk = (int)ks->count;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nq, nk, p->head_dim, p->scale, q,
                (int)ldq, k, (int)ldk, 0.0f, s, nk);
    for (int i = 0; i < nq; ++i) {
        float *row = s + (size_t)i * nk;
        if (p->softcap > 0.0f)
            softcap_row(row, tanh_s ? tanh_s + (size_t)i * nk : NULL, nk, p->softcap);
        if (p->alibi)
            alibi_row(row, nk, p->alibi[h], qs->pos + i * qs->stride + delta, ks->pos, ks->stride);
        if (kind == RA_BLOCK_PARTIAL) { /* SPEC 3: masked logits are exactly -inf */
            for (int j = 0; j < row_begin[i]; ++j) row[j] = -INFINITY;
            for (int j = row_end[i]; j < nk; ++j) row[j] = -INFINITY;
        }
    }
}
