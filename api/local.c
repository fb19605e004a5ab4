/* Which global tokens a rank holds (SPEC 8), and scatter/gather of tensors by that map. */
#include <string.h>

#include "base/error.h"
#include "plan/grid.h"
#include "plan/plan.h"
#include "base/view.h"

/* *count rows of shard sh and, when global_index is not NULL, their indices by cu. */
static ringattn_status_t local_rows(const char *fn, ringattn_plan_t plan, const ra_shard *sh,
                                    const int32_t *cu, int64_t *count, int32_t *global_index)
{
    RA_CHECK(count != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: count: got NULL, expected a pointer", fn);
    *count = sh->rows;
    if (global_index) ra__shard_global_index(sh, cu, global_index);
    ra__clear_error(); /* a success leaves no message behind, as every call (DESIGN: errors) */
    return RINGATTN_SUCCESS;
}

/* A 2D plan's rows (plan/grid.h): its piece of its group's tokens, queries and keys alike. */
static ringattn_status_t grid_rows(const char *fn, const ra_grid *g, int64_t *count,
                                   int32_t *global_index)
{
    RA_CHECK(count != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: count: got NULL, expected a pointer", fn);
    *count = ra__grid_rows(g, g->member);
    if (global_index)
        memcpy(global_index, ra__grid_tokens(g), (size_t)*count * sizeof(int32_t));
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_plan_local_tokens(ringattn_plan_t plan, int64_t *count,
                                            int32_t *global_index)
{
    static const char fn[] = "ringattn_plan_local_tokens";
    RA_TRY(ra__plan_check(fn, plan));
    if (plan->grid) return grid_rows(fn, plan->grid, count, global_index);
    return local_rows(fn, plan, plan->kp.queries, plan->cu_q, count, global_index);
}

ringattn_status_t ringattn_plan_local_keys(ringattn_plan_t plan, int64_t *count,
                                          int32_t *global_index)
{
    static const char fn[] = "ringattn_plan_local_keys";
    RA_TRY(ra__plan_check(fn, plan));
    if (plan->grid && plan->grid->cache) /* a KV cache's slots: the inner plan's */
        return local_rows(fn, plan->grid->inner, ra__local_keys(plan->grid->inner),
                          plan->grid->inner->cu_cache, count, global_index);
    if (plan->grid) return grid_rows(fn, plan->grid, count, global_index);
    return local_rows(fn, plan, ra__local_keys(plan), plan->cu_cache, count, global_index);
}

/* One row of every head between the global and the local tensor. */
static void move_row(const ra_view *g, int64_t global_row, const ra_view *l, int64_t local_row,
                     int heads, int dim, int to_local)
{
    for (int h = 0; h < heads; ++h) {
        void *gp = ra__view_at(g, global_row, h), *lp = ra__view_at(l, local_row, h);
        memcpy(to_local ? lp : gp, to_local ? gp : lp, (size_t)dim * g->elem);
    }
}

/* Copies row by row between the global and the local tensor (to_local: scatter). */
static ringattn_status_t move_rows(const char *fn, ringattn_plan_t p, ringattn_dtype_t dt,
                                   int heads, int dim, ringattn_tensor_t global,
                                   ringattn_tensor_t local, int to_local)
{
    RA_TRY(ra__plan_check(fn, p));
    RA_CHECK(dt == RINGATTN_FLOAT32 || dt == RINGATTN_FLOAT16 || dt == RINGATTN_BFLOAT16,
             RINGATTN_ERR_INVALID_ARGUMENT, "%s: dtype: got %d, expected a ringattn_dtype_t", fn,
             (int)dt);
    RA_CHECK(heads > 0 && dim > 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: heads/dim: got %d/%d, expected > 0", fn, heads, dim);
    ra_view g, l;
    const ra_grid *grid = p->grid;
    const struct ringattn_plan *owner = grid ? grid->inner : p; /* the tokens' boundaries */
    const ra_shard *q = owner->kp.queries;
    const int64_t total = owner->cu_q[owner->kp.num_seqs];
    const int64_t rows = grid ? ra__grid_rows(grid, grid->member) : q->rows;
    RA_TRY(ra__view_make(fn, "global", global, dt, total, heads, dim, !to_local, &g));
    RA_TRY(ra__view_make(fn, "local", local, dt, rows, heads, dim, to_local, &l));
    for (int64_t r = 0; grid && r < rows; ++r)
        move_row(&g, ra__grid_tokens(grid)[r], &l, r, heads, dim, to_local);
    for (int i = 0; !grid && i < q->num_segs; ++i) {
        const ra_segment *seg = &q->segs[i];
        for (int64_t j = 0; j < seg->span.count; ++j)
            move_row(&g, ra__segment_global(seg, p->cu_q, j), &l, seg->row + j, heads, dim,
                     to_local);
    }
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_plan_scatter(ringattn_plan_t plan, ringattn_dtype_t dtype, int heads,
                                        int dim, ringattn_tensor_t global, ringattn_tensor_t local)
{
    return move_rows("ringattn_plan_scatter", plan, dtype, heads, dim, global, local, 1);
}

ringattn_status_t ringattn_plan_gather(ringattn_plan_t plan, ringattn_dtype_t dtype, int heads,
                                       int dim, ringattn_tensor_t local, ringattn_tensor_t global)
{
    return move_rows("ringattn_plan_gather", plan, dtype, heads, dim, global, local, 0);
}
