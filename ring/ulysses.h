/*
 * The all-to-all of a 2D plan (plan/grid.h): tensors moved between this rank's tokens of every
 * head and its group's tokens of its heads. Internal.
 */
#ifndef RINGATTN_RING_ULYSSES_H
#define RINGATTN_RING_ULYSSES_H

#include "base/view.h"
#include "kernels/backend.h"
#include "plan/grid.h"

/* One tensor of the move: [rows, heads, dim] views (a [heads, T] float32 one, LSE or a key
   bias, is rows = T, dim 1, row stride 1), split by heads of kind `kind` (plan/grid.h). */
typedef struct ra_ulysses_move {
    const ra_view *mine;        /* this rank's rows, every head (the caller's tensor) */
    const ra_view *group;       /* the group's rows, this rank's heads (the inner plan's) */
    ringattn_dtype_t dtype;     /* of mine */
    ringattn_dtype_t group_dtype; /* of group: dtype, or float32 for sums of replicated heads */
    int kind, dim;
} ra_ulysses_move;

/* The caller's rows of every member's heads into the group's rows of this rank's heads. */
ringattn_status_t ra__ulysses_to_heads(const ra_grid *g, const struct ra_backend *be,
                                       const ra_ulysses_move *m, void *stream);
/* The group's rows of this rank's heads back to their members' tokens; heads replicated across
   the group (ra__grid_replicated) are the float32 sums of their members' parts, in member order. */
ringattn_status_t ra__ulysses_to_tokens(const ra_grid *g, const struct ra_backend *be,
                                        const ra_ulysses_move *m, void *stream);

/* A KV cache plan's outputs (every query on every rank): this rank's heads of mine, written
   by the inner plan, to every member of the group, and theirs into mine (an allgather by heads;
   m->group is unused). */
ringattn_status_t ra__ulysses_gather_heads(const ra_grid *g, const struct ra_backend *be,
                                           const ra_ulysses_move *m, void *stream);

#endif
