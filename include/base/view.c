/* Tensor argument checks shared by forward, backward and merge. */
#include "base/view.h"
#include "base/error.h"

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
    if (is_output && rows > 1 && heads > 1) {
        /* Either heads nest inside rows ([T, H, D]) or rows inside heads ([H, T, D]). */
        const int ok = rs >= (heads - 1) * hs + dim || hs >= (rows - 1) * rs + dim;
        RA_CHECK(ok, RINGATTN_ERR_INVALID_ARGUMENT,
                 "%s: %s strides: got row %lld, head %lld, expected an output that does not "
                 "overlap itself",
                 fn, name, (long long)rs, (long long)hs);
    }
    out->data = t.data;
    out->row = rs;
    out->head = hs;
    out->elem = ra__dtype_size(dt);
    return RINGATTN_SUCCESS;
}
