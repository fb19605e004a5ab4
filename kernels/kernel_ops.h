/* The backend table of DESIGN "two small tables": one per backend (cpu/, later cuda/). */
#ifndef RINGATTN_KERNELS_KERNEL_OPS_H
#define RINGATTN_KERNELS_KERNEL_OPS_H

#include "masks/shard.h"
#include "base/view.h"
#include "ringattn.h"

struct ringattn_plan;
struct ra_workspace;

/* Called now and then by one thread during a kernel call, so transfers progress (overlap). */
typedef struct ra_progress {
    void (*fn)(void *ctx);
    void *ctx;
} ra_progress;

/*
 * One forward call: local queries against one shard of keys, merged into the running state
 * (m, l [H, q rows], acc [q rows, H, D_v]) when the call is one ring step of several; with
 * m == NULL the state lives in the tile (first and last step at once).
 */
/* SPEC 6 inputs of a call: the key shard's bias and the local queries' top-k thresholds. */
typedef struct ra_dyn_io {
    const float *bias;   /* [H_b, ld] of the key shard, or NULL: no dynamic mask */
    int64_t ld;          /* row length of bias and dbias: the key shard's rows */
    const float *thr_b;  /* [H_b, q rows] (masks/topk.h), or NULL: no selection */
    const int64_t *thr_p;
    float *dbias;        /* backward: [H_b, ld], overwritten (added to with accumulate) or NULL */
} ra_dyn_io;

typedef struct ra_fwd_io {
    const ra_view *q, *k, *v;
    const ra_shard *qsh, *ksh;
    const ra_view *o; /* written, with lse, on the last step */
    float *lse;
    float *m, *l, *acc;
    int first, last;
    ra_progress progress;
    ra_dyn_io dyn;
} ra_fwd_io;

/*
 * One backward call (SPEC 7): local queries against one shard of keys. Outputs are overwritten
 * in the plan's dtype, or, with accumulate set, are float32 sums added to (ring steps).
 */
typedef struct ra_bwd_io {
    const ra_view *q, *k, *v, *o, *dout;
    const float *lse;
    const ra_shard *qsh, *ksh;
    const ra_view *dq, *dk, *dv;
    int accumulate;
    ra_progress progress;
    ra_dyn_io dyn;
} ra_bwd_io;


struct ra_kernel_ops {
    const char *name;
    /* Can this backend run the plan? (message + RINGATTN_ERR_UNSUPPORTED if not) */
    ringattn_status_t (*supports)(const struct ringattn_plan *plan);
    /* One step: the plan's local queries against one shard of keys (ra_fwd_io). */
    ringattn_status_t (*attend_forward)(struct ringattn_plan *plan, const ra_fwd_io *io);
    ringattn_status_t (*attend_backward)(struct ringattn_plan *plan, const ra_bwd_io *io);
    void (*workspace_free)(struct ra_workspace *ws);
};

extern const struct ra_kernel_ops ra__cpu_kernel_ops;

#endif
