/* Tile loads, stores and logits shared by the CPU forward and backward passes. */
#include <math.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/isa.h"
#include "masks/topk.h"

RA_CPU_CLONES const float *ra__tile_load(const ra_view *v, ringattn_dtype_t dt, int64_t row0, int n, int h,
                           int dim, float *buf, int64_t *ld)
{
    if (dt == RINGATTN_FLOAT32) {
        *ld = v->row;
        return (const float *)ra__view_at(v, row0, h);
    }
    for (int i = 0; i < n; ++i)
        ra__load_f32(buf + (size_t)i * dim, ra__view_at(v, row0 + i, h), dt, dim);
    *ld = dim;
    return buf;
}

RA_CPU_CLONES void ra__tile_store(const ra_view *v, ringattn_dtype_t dt, int accumulate, int64_t row0, int n,
                    int h, int dim, const float *src, int64_t ld)
{
    for (int i = 0; i < n; ++i) {
        const float *s = src + (size_t)i * ld;
        void *dst = ra__view_at(v, row0 + i, h);
        if (accumulate) {
            float *d = dst;
            for (int c = 0; c < dim; ++c) d[c] += s[c];
        } else {
            ra__store_f32(dst, dt, s, dim);
        }
    }
}

ra_qtile ra__qtile(const ra_kernel_params *p, const float *q, int64_t ldq, int nq,
                   int scale_first, float *buf)
{
    const float scale = ra__logit_scale(p);
    if (!scale_first) return (ra_qtile){q, ldq, scale, 1};
    const int D = p->head_dim;
    for (int i = 0; i < nq; ++i)
        for (int c = 0; c < D; ++c) buf[(size_t)i * D + c] = scale * q[(size_t)i * ldq + c];
    return (ra_qtile){buf, D, 1.0f, 0};
}

/* v clamped to the int32 range. */
static inline int64_t clamp_i32(int64_t v)
{
    return v < INT32_MIN ? INT32_MIN : (v > INT32_MAX ? INT32_MAX : v);
}

/* SPEC 2: z = softcap * tanh(z'), z' = q . k scale / softcap as the product gave it (the scale
   ra__logit_scale); the tanh values are the backward's derivative. */
static void softcap_row(float *s, float *t, int n, float cap)
{
    for (int j = 0; j < n; ++j) {
        const float th = tanhf(s[j]);
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

int ra__batch_fill(ra_key_batch *b, int bk, const ra_span *ks, int64_t krow, const float *bias,
                   float tmin, int *j)
{
    for (; *j < (int)ks->count; ++*j) {
        if (b->n == bk) return 1;
        if (!(bias[*j] < tmin)) ra__batch_add_key(b, ks, krow, bias, *j);
    }
    return b->n == bk;
}

/* The batch's rows of head h of v as float32 [n, dim] in buf. */
static void batch_load(const ra_view *v, ringattn_dtype_t dt, const ra_key_batch *b, int h,
                       int dim, float *buf)
{
    for (int j = 0; j < b->n; ++j) {
        int64_t ld;
        const float *row = ra__tile_load(v, dt, b->row[j], 1, h, dim, buf + (size_t)j * dim, &ld);
        if (row != buf + (size_t)j * dim) memcpy(buf + (size_t)j * dim, row, dim * sizeof *row);
    }
}

void ra__batch_gather(const ra_kernel_params *p, const ra_view *k, const ra_view *v, int g,
                      const ra_key_batch *b, float *kb, float *vb)
{
    batch_load(k, p->dtype, b, g, p->head_dim, kb);
    batch_load(v, p->dtype, b, g, p->head_dim_v, vb);
}

RA_CPU_CLONES void ra__batch_logits(const ra_kernel_params *p, ra_thread_ws *w, int h,
                                    const ra_span *qs, const ra_key_batch *b, const ra_qtile *q,
                                    float *tanh_s, const ra_tile_dyn *dyn)
{
    float *s = w->s;
    const int nq = (int)qs->count, n = b->n, D = p->head_dim;
    const int64_t delta = p->delta[qs->seq];
    const ra_window win = p->window;
    ra__cpu_gemm(w, q->exact ? RA_BF16 : RA_F32, 0, 1, nq, n, D, q->alpha, q->data, q->ld, w->kb,
                 D, 0.0f, s, n);
    const float slope = p->alibi ? p->alibi[h] : 0.0f;
    const int32_t *restrict pos = b->pos;
    const float *restrict bias = b->bias;
    for (int i = 0; i < nq; ++i) {
        float *restrict row = s + (size_t)i * n;
        const int64_t qp = qs->pos + i * qs->stride + delta;
        if (p->softcap > 0.0f)
            softcap_row(row, tanh_s ? tanh_s + (size_t)i * n : NULL, n, p->softcap);
        if (slope != 0.0f) /* the order of the span path: ALiBi, then bias */
            for (int j = 0; j < n; ++j)
                row[j] -= slope * (float)(qp > pos[j] ? qp - pos[j] : pos[j] - qp);
        /* SPEC 3 window and the SPEC 6 threshold rule (masks/topk.h, RA_TOPK_KEEPS) as int32
           lane compares (positions fit int32) */
        const int32_t lo = (int32_t)clamp_i32(win.left < 0 ? INT32_MIN : qp - win.left);
        const int32_t hi = (int32_t)clamp_i32(win.right < 0 ? INT32_MAX : qp + win.right);
        const int32_t tp = (int32_t)clamp_i32(dyn->thr_p[i]);
        const float tb = dyn->thr_b[i];
#pragma omp simd
        for (int j = 0; j < n; ++j) {
            const int keep = RA_TOPK_KEEPS(bias[j], pos[j], tb, tp);
            const int seen = (pos[j] >= lo) & (pos[j] <= hi);
            row[j] = keep & seen ? row[j] + bias[j] : -INFINITY;
        }
    }
}

int ra__tile_dyn(const ra_kernel_params *p, const ra_dyn_io *io, int h, int64_t qrow, int nq,
                 int64_t qrows, int64_t krow, int nk, struct ra_tile_dyn *out,
                 const struct ra_tile_dyn **use)
{
    *use = NULL;
    if (!io->bias) return 1;
    const int hb = h / (p->num_heads / p->bias_heads);
    out->bias = io->bias + hb * io->ld + krow;
    out->thr_b = io->thr_b ? io->thr_b + hb * qrows + qrow : NULL;
    out->thr_p = io->thr_p ? io->thr_p + hb * qrows + qrow : NULL;
    *use = out;
    if (!out->thr_b) return 1;
    float bmin = INFINITY, bmax = -INFINITY, tmin = INFINITY, tmax = -INFINITY;
    for (int j = 0; j < nk; ++j) {
        bmin = out->bias[j] < bmin ? out->bias[j] : bmin;
        bmax = out->bias[j] > bmax ? out->bias[j] : bmax;
    }
    for (int i = 0; i < nq; ++i) {
        tmin = out->thr_b[i] < tmin ? out->thr_b[i] : tmin;
        tmax = out->thr_b[i] > tmax ? out->thr_b[i] : tmax;
    }
    out->tmin = tmin;
    out->whole = tmax < bmin;
    return ra__topk_block_kept(bmax, tmin);
}

RA_CPU_CLONES void ra__tile_logits(const ra_kernel_params *p, ra_thread_ws *w, int h,
                                   const ra_span *qs, const ra_span *ks, int64_t delta,
                                   ra_block_kind kind, const ra_qtile *q, const float *k,
                                   int64_t ldk, float *tanh_s, const struct ra_tile_dyn *dyn)
{
    float *s = w->s;
    const int32_t *row_begin = w->row_begin, *row_end = w->row_end;
    const int nq = (int)qs->count, nk = (int)ks->count;
    ra__cpu_gemm(w, q->exact ? RA_BF16 : RA_F32, 0, 1, nq, nk, p->head_dim, q->alpha, q->data,
                 q->ld, k, ldk, 0.0f, s, nk);
    for (int i = 0; i < nq; ++i) {
        float *row = s + (size_t)i * nk;
        if (p->softcap > 0.0f)
            softcap_row(row, tanh_s ? tanh_s + (size_t)i * nk : NULL, nk, p->softcap);
        if (p->alibi)
            alibi_row(row, nk, p->alibi[h], qs->pos + i * qs->stride + delta, ks->pos, ks->stride);
        if (dyn) /* SPEC 6: + bias, not scaled */
            for (int j = 0; j < nk; ++j) row[j] += dyn->bias[j];
        if (kind == RA_BLOCK_PARTIAL) { /* SPEC 3: masked logits are exactly -inf */
            for (int j = 0; j < row_begin[i]; ++j) row[j] = -INFINITY;
            for (int j = row_end[i]; j < nk; ++j) row[j] = -INFINITY;
        }
    }
}
