/* ringattn_merge_partials: the SPEC 5 merge of normalised partial results, for callers. */
#include <stdio.h>
#include <stdlib.h>

#include "base/error.h"
#include "base/view.h"
#include "kernels/backends.h"

#define FN "ringattn_merge_partials"

/* Every argument but the partials' tensors. */
static ringattn_status_t check_args(int n, int64_t T, int H, int dv, ringattn_dtype_t dt,
                                    const ringattn_tensor_t *parts_o,
                                    const float *const *parts_lse, const float *out_lse)
{
    RA_CHECK(n >= 1 && n <= 65536, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": num_partials: got %d, expected 1..65536", n);
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
    for (int s = 0; s < n; ++s)
        RA_CHECK(parts_lse[s] || T == 0, RINGATTN_ERR_INVALID_ARGUMENT,
                 FN ": parts_lse[%d]: got NULL, expected [num_heads, num_tokens] float32", s);
    return RINGATTN_SUCCESS;
}

/* Partial s's view (views == NULL: checked only). */
static ringattn_status_t part_view(int s, int64_t T, int H, int dv, ringattn_dtype_t dt,
                                   const ringattn_tensor_t *parts_o, ra_view *views)
{
    char name[24];
    snprintf(name, sizeof name, "parts_o[%d]", s);
    ra_view v;
    RA_TRY(ra__view_make(FN, name, parts_o[s], dt, T, H, dv, 0, &v));
    if (views) views[s] = v;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_merge_partials(int num_partials, int64_t num_tokens, int num_heads,
                                          int head_dim_v, ringattn_dtype_t dtype,
                                          const ringattn_tensor_t *parts_o,
                                          const float *const *parts_lse,
                                          ringattn_tensor_t out_o, float *out_lse)
{
    const int n = num_partials, H = num_heads, dv = head_dim_v;
    const int64_t T = num_tokens;
    /* Bad input is its own status with nothing written, even when no memory is left: every
       argument is checked before the views' array is allocated (then filled by the same,
       now infallible, checks). */
    RA_TRY(check_args(n, T, H, dv, dtype, parts_o, parts_lse, out_lse));
    for (int s = 0; s < n; ++s) RA_TRY(part_view(s, T, H, dv, dtype, parts_o, NULL));
    ra_view out;
    RA_TRY(ra__view_make(FN, "out_o", out_o, dtype, T, H, dv, 1, &out));
    ra_view *views = malloc((size_t)n * sizeof *views);
    RA_CHECK(views != NULL, RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory (%d views)", n);
    for (int s = 0; s < n; ++s) (void)part_view(s, T, H, dv, dtype, parts_o, views);
    /* The CPU backend's merge: the caller's tensors are host memory (no plan, no device). */
    const ra_merge_io io = {n, T, H, dv, dtype, views, parts_lse, &out, out_lse};
    const ringattn_status_t st = ra__backend_find(RINGATTN_BACKEND_CPU)->merge(&io, NULL);
    free(views);
    if (st != RINGATTN_SUCCESS) return st;
    ra__clear_error();
    return RINGATTN_SUCCESS;
}
