/* Tensor argument checks shared by forward, backward, merge, scatter and gather. */
#include <stdint.h>

#include "base/view.h"
#include "base/error.h"

/*
 * Does the offset of the last element, (rows - 1) row + (heads - 1) head + dim - 1 elements of
 * elem bytes, fit int64 in bytes? ra__view_at computes it so (SPEC 1: element (t, h, c) is at
 * t * row + h * head + c); no memory is larger, so a tensor that does not is a caller bug.
 * Every step is checked before it is taken (all terms are >= 0).
 */
static int extent_fits(int64_t rows, int heads, int dim, int64_t rs, int64_t hs, size_t elem)
{
    const int64_t lim = INT64_MAX / (int64_t)elem;
    int64_t off = dim - 1;
    if (rows > 1) {
        if (rs > (lim - off) / (rows - 1)) return 0;
        off += (rows - 1) * rs;
    }
    if (heads > 1) {
        if (hs > (lim - off) / (heads - 1)) return 0;
        off += (int64_t)(heads - 1) * hs;
    }
    return 1;
}

ringattn_status_t ra__view_make(const char *fn, const char *name, ringattn_tensor_t t,
                                ringattn_dtype_t dt, int64_t rows, int heads, int dim,
                                int is_output, ra_view *out)
{
    RA_CHECK(t.data != NULL || rows == 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: %s.data: got NULL, expected %lld rows of %d heads x %d", fn, name,
             (long long)rows, heads, dim);
    RA_CHECK(t.row_stride >= 0 && t.head_stride >= 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: %s strides: got row %lld, head %lld, expected >= 0 (0 = packed)", fn, name,
             (long long)t.row_stride, (long long)t.head_stride);
    const int64_t hs = t.head_stride ? t.head_stride : dim;
    const int64_t rs = t.row_stride ? t.row_stride : (int64_t)heads * dim;
    RA_CHECK(rs >= dim && (heads == 1 || hs >= dim), RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: %s strides: got row %lld, head %lld, expected >= dim = %d (last dim contiguous)",
             fn, name, (long long)rs, (long long)hs, dim);
    const size_t elem = ra__dtype_size(dt);
    RA_CHECK(rows == 0 || extent_fits(rows, heads, dim, rs, hs, elem),
             RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: %s strides: got row %lld, head %lld for %lld rows of %d heads x %d, expected "
             "the last element within INT64_MAX bytes of the first",
             fn, name, (long long)rs, (long long)hs, (long long)rows, heads, dim);
    /* The CPU backend hands row strides to BLAS as its int leading dimension (cuBLAS's is int
       too): a larger one would be truncated into a wrong but valid-looking stride. */
    RA_CHECK(rs <= INT32_MAX, RINGATTN_ERR_UNSUPPORTED,
             "%s: %s strides: got row %lld, expected at most INT32_MAX = %d elements (the "
             "largest row stride supported: BLAS takes int strides; head strides may be larger)",
             fn, name, (long long)rs, INT32_MAX);
    if (is_output && rows > 1 && heads > 1) {
        /* Either heads nest inside rows ([T, H, D]) or rows inside heads ([H, T, D]); the
           extent check above keeps both products in int64. */
        const int ok = rs >= (heads - 1) * hs + dim || hs >= (rows - 1) * rs + dim;
        RA_CHECK(ok, RINGATTN_ERR_INVALID_ARGUMENT,
                 "%s: %s strides: got row %lld, head %lld, expected an output that does not "
                 "overlap itself",
                 fn, name, (long long)rs, (long long)hs);
    }
    out->data = t.data;
    out->row = rs;
    out->head = hs;
    out->elem = elem;
    return RINGATTN_SUCCESS;
}
