/*
 * The CPU backend's memory and element work (kernels/backend.h): the ring driver's buffers
 * are host memory and every operation on them runs on the calling thread, in call order.
 */
#include <math.h>
#include "kernels/cpu/threads.h"
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/isa.h"
#include "kernels/softmax_state.h"

static ringattn_status_t host_alloc(size_t bytes, void **ptr)
{
    const size_t rounded = (bytes + 63) & ~(size_t)63; /* aligned_alloc: a multiple of 64 */
    *ptr = aligned_alloc(64, rounded ? rounded : 64);
    RA_CHECK(*ptr != NULL, RINGATTN_ERR_OUT_OF_MEMORY, "ringattn: out of memory (%zu bytes)",
             bytes);
    return RINGATTN_SUCCESS;
}

static void host_free(void *ptr) { free(ptr); }

static ringattn_status_t host_zero(void *dst, size_t bytes, void *stream)
{
    (void)stream;
    if (bytes) memset(dst, 0, bytes);
    return RINGATTN_SUCCESS;
}

static ringattn_status_t host_move(void *dst, const void *src, size_t bytes, void *stream)
{
    (void)stream;
    if (bytes) memcpy(dst, src, bytes);
    return RINGATTN_SUCCESS;
}

/* Host memory, in call order: no device, streams or events (base/memory_ops.h). */
const ra_memory_ops ra__host_memory = {
    .name = "host",
    .alloc = host_alloc,
    .free = host_free,
    .zero = host_zero,
    .copy_from_host = host_move,
    .copy_to_host = host_move,
};

ringattn_status_t ra__cpu_copy(const ra_copy *c, void *stream)
{
    (void)stream;
    RA_CHECK(c->src_dtype == c->dst_dtype || c->src_dtype == RINGATTN_FLOAT32,
             RINGATTN_ERR_INTERNAL, "ringattn: copy from dtype %d to %d", (int)c->src_dtype,
             (int)c->dst_dtype);
    for (int64_t t = 0; t < c->rows; ++t)
        for (int h = 0; h < c->heads; ++h) {
            const void *s = ra__view_at(c->src, t, h);
            void *d = ra__view_at(c->dst, t, h);
            if (c->src_dtype == c->dst_dtype) memcpy(d, s, (size_t)c->dim * c->dst->elem);
            else ra__store_f32(d, c->dst_dtype, s, c->dim); /* float32 sums into the dtype */
        }
    return RINGATTN_SUCCESS;
}

RA_CPU_CLONES void ra__cpu_add_floats(float *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

ringattn_status_t ra__cpu_add_f32(float *dst, const float *src, size_t n, void *stream)
{
    (void)stream;
    ra__cpu_add_floats(dst, src, n);
    return RINGATTN_SUCCESS;
}

/* max |x| over the dim elements at x (float32), and whether one is NaN: vectorised. */
static float row_absmax(const float *restrict x, int dim, int *nan)
{
    float m = 0.0f;
    int bad = 0;
#pragma omp simd reduction(max : m) reduction(| : bad)
    for (int c = 0; c < dim; ++c) {
        const float a = fabsf(x[c]);
        m = a > m ? a : m;
        bad |= a != a;
    }
    *nan |= bad;
    return m;
}

/* max |x| over rows x heads x dim elements of v (NaN if one is NaN), rows split over threads:
   the call's input scan (SPEC 9), a read of Q and K at memory speed. */
static float absmax(const ra_kernel_params *p, const struct ra_workspace *ws, const ra_view *v,
                    int64_t rows, int heads, int dim)
{
    float m = 0.0f;
    int nan = 0;
    const int f32 = p->dtype == RINGATTN_FLOAT32;
#pragma omp parallel for reduction(max : m) reduction(| : nan) num_threads(ra__cpu_threads(p, ws))
    for (int64_t t = 0; t < rows; ++t) {
        float buf[RA_MAX_HEAD_DIM];
        for (int h = 0; h < heads; ++h) {
            const void *at = ra__view_at(v, t, h);
            if (!f32) ra__load_f32(buf, at, p->dtype, dim);
            const float a = row_absmax(f32 ? (const float *)at : buf, dim, &nan);
            m = a > m ? a : m;
        }
    }
    return nan ? NAN : m;
}

ringattn_status_t ra__cpu_scan(struct ra_workspace *ws, const ra_kernel_params *p,
                               const ra_scan_io *io, ra_scan *out)
{
    /* float16 cannot overflow the product: 65504^2 * 256 is about 1.1e12 (SPEC 9) */
    const int bounded = p->dtype == RINGATTN_FLOAT16;
    out->q_absmax = bounded ? 0.0f : absmax(p, ws, io->q, io->q_rows, p->num_heads, p->head_dim);
    out->k_absmax =
        bounded ? 0.0f : absmax(p, ws, io->k, io->k_rows, p->num_kv_heads, p->head_dim);
    out->lossy_rows = 0;
    for (int64_t i = 0; io->lse && i < (int64_t)p->num_heads * io->q_rows; ++i)
        out->lossy_rows += ra__lse_lossy(io->lse[i]);
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__cpu_merge(const ra_merge_io *io, void *stream)
{
    (void)stream;
    const int n = io->n, dv = io->dim;
    float *buf = malloc((2 * (size_t)n + 2 * (size_t)dv) * sizeof *buf);
    RA_CHECK(buf != NULL, RINGATTN_ERR_OUT_OF_MEMORY, "ringattn_merge_partials: out of memory");
    /* Row by row, every input of a row read before its outputs are written: in place is safe. */
    float *lse = buf, *weight = buf + n, *row = buf + 2 * n, *part = row + dv;
    for (int h = 0; h < io->heads; ++h) {
        for (int64_t t = 0; t < io->rows; ++t) {
            float merged_lse;
            for (int s = 0; s < n; ++s) lse[s] = io->parts_lse[s][h * io->rows + t];
            ra__merge_weights(lse, n, weight, &merged_lse);
            for (int c = 0; c < dv; ++c) row[c] = 0.0f;
            for (int s = 0; s < n; ++s) {
                if (weight[s] == 0.0f) continue; /* empty partial: skipped, never multiplied */
                ra__load_f32(part, ra__view_at(&io->parts[s], t, h), io->dtype, dv);
                for (int c = 0; c < dv; ++c) row[c] += weight[s] * part[c];
            }
            ra__store_f32(ra__view_at(io->out, t, h), io->dtype, row, dv);
            io->out_lse[h * io->rows + t] = merged_lse;
        }
    }
    free(buf);
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__cpu_state_partial(struct ra_workspace *ws, const ra_kernel_params *p,
                                        const ra_fwd_io *io, float *part)
{
    (void)ws;
    const int64_t rows = p->queries->rows;
    const int H = p->num_heads, dv = p->head_dim_v;
    float *lse = part + rows * H * dv;
    for (int h = 0; h < H; ++h)
        for (int64_t t = 0; t < rows; ++t) {
            const int64_t at = (t * H + h) * dv;
            ra__state_finalize(io->m[h * rows + t], io->l[h * rows + t], -INFINITY, io->acc + at,
                               dv, part + at, &lse[h * rows + t]); /* the sink: at the merge */
        }
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__cpu_merge_f32(const ra_kernel_params *p, const float *parts, int n,
                                    size_t stride, const float *sinks, const ra_view *o,
                                    float *out_lse, void *stream)
{
    (void)stream;
    const int64_t rows = p->queries->rows;
    const int H = p->num_heads, dv = p->head_dim_v;
    float row[RA_MAX_HEAD_DIM];
    for (int h = 0; h < H; ++h)
        for (int64_t t = 0; t < rows; ++t) {
            const float *lse = parts + rows * H * dv + h * rows + t, *po = parts + (t * H + h) * dv;
            float mx;
            float total = ra__merge_total(n, lse, (int64_t)stride, &mx);
            if (sinks) total = ra__merge_add_sink(sinks[h], &mx, total);
            for (int c = 0; c < dv; ++c)
                row[c] = total > 0.0f
                             ? ra__merge_column(n, lse, (int64_t)stride, po + c, (int64_t)stride, mx,
                                                total)
                             : ra__merge_no_column(total);
            ra__store_f32(ra__view_at(o, t, h), p->dtype, row, dv);
            out_lse[h * rows + t] = ra__merge_lse(mx, total);
        }
    return RINGATTN_SUCCESS;
}
