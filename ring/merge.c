/* ringattn_merge_partials: the SPEC 5 merge of normalised partial results, for callers. */
#include <stdlib.h>

#include "base/dtype.h"
#include "kernels/softmax_state.h"
#include "base/error.h"
#include "base/view.h"

#define FN "ringattn_merge_partials"

static float load_elem(const void *p, ringattn_dtype_t dt)
{
    if (dt == RINGATTN_FLOAT32) return *(const float *)p;
    const uint16_t h = *(const uint16_t *)p;
    return dt == RINGATTN_FLOAT16 ? ra__f16_to_f32(h) : ra__bf16_to_f32(h);
}

static void store_elem(void *p, ringattn_dtype_t dt, float x)
{
    if (dt == RINGATTN_FLOAT32) *(float *)p = x;
    else *(uint16_t *)p = dt == RINGATTN_FLOAT16 ? ra__f32_to_f16(x) : ra__f32_to_bf16(x);
}

static ringattn_status_t check_merge(int n, int64_t T, int H, int dv, ringattn_dtype_t dt,
                                     const ringattn_tensor_t *parts_o,
                                     const float *const *parts_lse, ringattn_tensor_t out_o,
                                     const float *out_lse, ra_view *views, ra_view *out)
{
    RA_CHECK(T >= 0, RINGATTN_ERR_INVALID_ARGUMENT, FN ": num_tokens: got %lld, expected >= 0",
             (long long)T);
    RA_CHECK(H > 0, RINGATTN_ERR_INVALID_ARGUMENT, FN ": num_heads: got %d, expected > 0", H);
    RA_CHECK(dv > 0, RINGATTN_ERR_INVALID_ARGUMENT, FN ": head_dim_v: got %d, expected > 0", dv);
    RA_CHECK(dt == RINGATTN_FLOAT32 || dt == RINGATTN_FLOAT16 || dt == RINGATTN_BFLOAT16,
             RINGATTN_ERR_INVALID_ARGUMENT, FN ": dtype: got %d, expected a ringattn_dtype_t",
             (int)dt);
    RA_CHECK(parts_o && parts_lse, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": parts_o/parts_lse: got NULL, expected arrays of num_partials = %d entries", n);
    RA_CHECK(out_lse || T == 0, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": out_lse: got NULL, expected [num_heads, num_tokens] float32");
    for (int s = 0; s < n; ++s) {
        RA_CHECK(parts_lse[s] || T == 0, RINGATTN_ERR_INVALID_ARGUMENT,
                 FN ": parts_lse[%d]: got NULL, expected [num_heads, num_tokens] float32", s);
        RA_TRY(ra__view_make(FN, "parts_o[]", parts_o[s], dt, T, H, dv, 0, &views[s]));
    }
    return ra__view_make(FN, "out_o", out_o, dt, T, H, dv, 1, out);
}

ringattn_status_t ringattn_merge_partials(int num_partials, int64_t num_tokens, int num_heads,
                                          int head_dim_v, ringattn_dtype_t dtype,
                                          const ringattn_tensor_t *parts_o,
                                          const float *const *parts_lse,
                                          ringattn_tensor_t out_o, float *out_lse)
{
    const int n = num_partials, H = num_heads, dv = head_dim_v;
    const int64_t T = num_tokens;
    RA_CHECK(n >= 1 && n <= 65536, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": num_partials: got %d, expected 1..65536", n);
    ra_view *views = malloc((size_t)n * sizeof *views);
    float *buf = malloc((2 * (size_t)n + (size_t)(dv > 0 ? dv : 0)) * sizeof *buf);
    ra_view out;
    ringattn_status_t st = RINGATTN_SUCCESS;
    if (!views || !buf) st = ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    if (st == RINGATTN_SUCCESS)
        st = check_merge(n, T, H, dv, dtype, parts_o, parts_lse, out_o, out_lse, views, &out);
    if (st != RINGATTN_SUCCESS) {
        free(views);
        free(buf);
        return st;
    }
    /* Row by row, every input of a row read before its outputs are written: in place is safe. */
    float *lse = buf, *weight = buf + n, *row = buf + 2 * n;
    for (int h = 0; h < H; ++h) {
        for (int64_t t = 0; t < T; ++t) {
            float merged_lse;
            for (int s = 0; s < n; ++s) lse[s] = parts_lse[s][h * T + t];
            ra__merge_weights(lse, n, weight, &merged_lse);
            for (int c = 0; c < dv; ++c) row[c] = 0.0f;
            for (int s = 0; s < n; ++s) {
                if (weight[s] == 0.0f) continue; /* empty partial: skipped, never multiplied */
                const char *o = ra__view_at(&views[s], t, h);
                for (int c = 0; c < dv; ++c)
                    row[c] += weight[s] * load_elem(o + c * views[s].elem, dtype);
            }
            char *dst = ra__view_at(&out, t, h);
            for (int c = 0; c < dv; ++c) store_elem(dst + c * out.elem, dtype, row[c]);
            out_lse[h * T + t] = merged_lse;
        }
    }
    free(views);
    free(buf);
    ra__clear_error();
    return RINGATTN_SUCCESS;
}
