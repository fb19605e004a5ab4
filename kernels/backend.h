/*
 * The backend table: one per backend (kernels/cpu, kernels/cuda; kernels/backends.c lists a
 * build's). The plan finds it in that registry; the ring driver reaches the kernels, the
 * backend's memory and every element-wise operation on it only through this table, so that it
 * never touches tensor memory on the host. Internal.
 */
#ifndef RINGATTN_KERNELS_BACKEND_H
#define RINGATTN_KERNELS_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "base/memory_ops.h"
#include "base/view.h"
#include "kernels/params.h"
#include "ringattn.h"

struct ra_workspace; /* the backend's own, made at plan creation */

/* rows x heads x dim elements between two views: the same dtype, or float32 into src's dtype. */
typedef struct ra_copy {
    const ra_view *src, *dst;
    ringattn_dtype_t src_dtype, dst_dtype;
    int64_t rows;
    int heads, dim;
} ra_copy;

/* What the driver asks of a call's inputs before it decides anything (SPEC 9). */
typedef struct ra_scan_io {
    const ra_view *q, *k; /* the local queries' Q and the local keys' K */
    int64_t q_rows, k_rows;
    const float *lse;     /* backward: [H, q_rows] from the forward; NULL in the forward */
    int ring;             /* the values are agreed over a ring: they must reach the host */
    void *stream;
} ra_scan_io;

typedef struct ra_scan {
    float q_absmax, k_absmax; /* max |element| (NaN when an element is NaN) */
    int64_t lossy_rows;       /* (head, row) pairs with ra__lse_lossy(LSE) */
    int on_device;            /* one rank only: the maxima stay on the device, where the kernels
                                 decide SPEC 9's scaling (no host wait); the values above are
                                 then unset, and a backward's stats pass decides per tile which
                                 rows are lossy */
} ra_scan;

/* SPEC 5 merge of n normalised partials (views of [rows, heads, dim]) into out / out_lse. */
typedef struct ra_merge_io {
    int n;
    int64_t rows;
    int heads, dim;
    ringattn_dtype_t dtype;
    const ra_view *parts;
    const float *const *parts_lse;
    const ra_view *out;
    float *out_lse;
} ra_merge_io;

struct ra_backend {
    const char *name;
    ringattn_backend_t kind;
    /* Plan creation: refuse what the backend cannot run (RINGATTN_ERR_UNSUPPORTED and a
       message), decide the tiles and threads in prm; then make the workspace for them. */
    ringattn_status_t (*prepare)(ra_kernel_params *prm);
    ringattn_status_t (*workspace_create)(const ra_kernel_params *prm, struct ra_workspace **ws,
                                          size_t *bytes);
    void (*workspace_destroy)(struct ra_workspace *ws);
    /* Optional: what the workspace needs for backward calls, made by the plan's first one
       (*bytes: what that added to the workspace); NULL where workspace_create made it all. */
    ringattn_status_t (*backward_workspace)(const ra_kernel_params *prm, struct ra_workspace *ws,
                                            size_t *bytes);

    /* A call's tensor argument the kernels cannot take, refused before anything runs: memory
       of another kind or device, or (v non-NULL: Q, K, V) a base or stride the kernels cannot
       load. NULL where any host memory is fine (CPU). */
    ringattn_status_t (*check_tensor)(const struct ra_workspace *ws, const char *fn,
                                      const char *name, const void *data, const ra_view *v);
    /* The backend's memory (device memory on a GPU) and its order: one table for the driver
       and for device-aware transports (base/memory_ops.h); its entries take the device stream
       a call's call stream carries (ra__call_stream_device); the entries below take the host
       stream itself. Never NULL. */
    const struct ra_memory_ops *memory;
    /* Element work on the backend's memory, in stream order. */
    ringattn_status_t (*copy)(const ra_copy *c, void *stream);
    ringattn_status_t (*add_f32)(float *dst, const float *src, size_t n, void *stream);
    ringattn_status_t (*scan)(struct ra_workspace *ws, const ra_kernel_params *prm,
                              const ra_scan_io *io, ra_scan *out);
    /* A ring's agreed scan (this rank's max |Q|, the ring's max |K|) for the call's kernels,
       where they read it on the device; NULL where the driver's scale_q_first says it all. */
    ringattn_status_t (*scan_agreed)(struct ra_workspace *ws, const ra_kernel_params *prm,
                                     const ra_scan *agreed, void *stream);
    ringattn_status_t (*merge)(const ra_merge_io *io, void *stream);
    /* Inference (ring/cache.c). state_partial: the running state io's forward steps left (all
       with last = 0) as a normalised float32 partial (SPEC 4 finalise) at part: O [query rows,
       H, D_v] packed, then LSE [H, query rows]. merge_f32: SPEC 5 over n such partials at
       parts + s * stride floats, in order s = 0 .. n-1, and the sinks ([H] or NULL: SPEC 11,
       one more partial of O = 0) into O (the plan's dtype) and LSE; n = 0 without sinks gives
       O = 0 and LSE = -inf. */
    ringattn_status_t (*state_partial)(struct ra_workspace *ws, const ra_kernel_params *prm,
                                       const ra_fwd_io *io, float *part);
    ringattn_status_t (*merge_f32)(const ra_kernel_params *prm, const float *parts, int n,
                                   size_t stride, const float *sinks, const ra_view *o,
                                   float *lse, void *stream);
    /* Attention, one ring step per call (params.h). */
    ringattn_status_t (*attend_forward)(struct ra_workspace *ws, const ra_kernel_params *prm,
                                        const ra_fwd_io *io);
    ringattn_status_t (*backward_prologue)(struct ra_workspace *ws, const ra_kernel_params *prm,
                                           const ra_bwd_prologue_io *io);
    ringattn_status_t (*attend_backward)(struct ra_workspace *ws, const ra_kernel_params *prm,
                                         const ra_bwd_io *io);
};

extern const struct ra_backend ra__cpu_backend;
extern const struct ra_backend ra__cuda_backend; /* in builds with RINGATTN_HAVE_CUDA */

#endif
