/* Resolved views of [T, heads, dim] tensors (strides in elements) and their checks. Internal. */
#ifndef RINGATTN_BASE_VIEW_H
#define RINGATTN_BASE_VIEW_H

#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "ringattn.h"

typedef struct ra_view {
    char *data;
    int64_t row, head; /* strides in elements, resolved (never 0) */
    size_t elem;       /* bytes per element */
} ra_view;

/* Address of element (t, h, 0). */
static inline void *ra__view_at(const ra_view *v, int64_t t, int64_t h)
{
    return v->data + (size_t)(t * v->row + h * v->head) * v->elem;
}

/*
 * Checks one tensor argument of function fn and resolves its strides. is_output: it must not
 * overlap itself (two elements at one address would race).
 */
ringattn_status_t ra__view_make(const char *fn, const char *name, ringattn_tensor_t t,
                                ringattn_dtype_t dt, int64_t rows, int heads, int dim,
                                int is_output, ra_view *out);

#endif
