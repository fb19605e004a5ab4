/*
 * What a kernel may see of a plan and of a call (FlashAttention's Flash_fwd_params is the
 * model). ra_kernel_params is built once per plan, so a device backend can mirror it (and the
 * arrays it points to) to the GPU once; the per-step io structs below carry the call's tensors,
 * the running state and the dynamic-mask inputs of one ring step. Kernels include no plan or
 * driver header. Internal.
 */
#ifndef RINGATTN_KERNELS_PARAMS_H
#define RINGATTN_KERNELS_PARAMS_H

#include <math.h>
#include <stdint.h>

#include "base/view.h"
#include "masks/mask.h"
#include "masks/shard.h"
#include "masks/tiles.h"
#include "ringattn.h"

#define RA_MAX_HEAD_DIM 256 /* D and D_v (SPEC 1) */

typedef struct ra_kernel_params {
    /* shapes (SPEC 1) */
    int num_heads, num_kv_heads, head_dim, head_dim_v;
    ringattn_dtype_t dtype;
    int num_seqs;
    const int64_t *delta; /* [num_seqs] SPEC 2 delta = L_k - L_q (bottom-right alignment) */
    /* logits and masks (SPEC 2, 3, 6) */
    float scale, softcap;
    /* SPEC 9's level for the half dtypes: 0 (default) rounds P and dS to the storage dtype
       before the products that read them, 1 (high) keeps their float32 precision */
    int high_precision;
    const float *alibi;   /* [num_heads] or NULL */
    ra_window window;     /* causal folded in */
    int bias_heads;       /* H_b, 0 = no key bias */
    int selects;          /* a top-k keep_k drops keys somewhere (0 < keep_k < longest) */
    /* tiles and threads, decided at plan creation by the backend (tuning fields override) */
    int block_q, block_k;
    int keys_block;       /* rows of a backward key tile */
    int num_threads;      /* CPU threads of a call, 0 = OpenMP's default then (at most as many
                             as when the plan was made: the workspace is sized for those) */
    int device;           /* a device backend's ordinal: the descriptor's, -1 (the current one)
                             resolved by prepare */
    /* tokens: the local queries, and every key shard a step may hold */
    const ra_shard *queries;
    int num_key_shards;   /* ring: one per rank; one rank: 1 (the keys of cu_seqlens_k); a KV
                             cache: one per rank, and the new tokens' keys */
    int carries_state;    /* a call runs several steps whose state lives between them (a ring,
                             a KV cache plan): no step both starts and finalises it */
    int forward_only;     /* the plan never runs a backward (a KV cache's): no backward memory */
    const ra_shard *key_shards;
    /* [num_key_shards] the local queries' tiles (block_q) against each key shard's (block_k),
       classified once at plan creation (masks/tiles.h): what every kernel walks */
    const ra_tile_list *key_tiles;
} ra_kernel_params;

/* SPEC 6 inputs of a step: the held key shard's bias and the local queries' thresholds. */
typedef struct ra_dyn_io {
    const float *bias;   /* [H_b, ld] of the key shard, or NULL: no dynamic mask */
    int64_t ld;          /* row length of bias and dbias: the key shard's rows */
    const float *thr_b;  /* [H_b, query rows] (masks/topk.h), or NULL: no selection */
    const int64_t *thr_p;
    float *dbias;        /* backward: [H_b, ld], overwritten (added to with accumulate) or NULL */
} ra_dyn_io;

/*
 * One forward step: the local queries against one key shard, merged into the running state
 * (m, l [H, query rows], acc [query rows, H, D_v]) when the call has several steps; with
 * first and last both set the state lives in the tile and O, LSE are written directly.
 */
typedef struct ra_fwd_io {
    const ra_view *q, *k, *v;
    const ra_shard *keys; /* the held shard: one of the params' key_shards */
    const ra_view *o;     /* written, with lse, on the last step */
    float *lse;
    float *m, *l, *acc;
    int first, last;
    /* SPEC 9 exact backward: only (m, l) of the query tiles holding a row whose LSE (read from
       lse) is too large for log(l) to survive in it (ra__lse_lossy); nothing else is written */
    int stats_only;
    int scale_q_first;    /* SPEC 9: scale Q before the product (it could overflow after) */
    void *stream;         /* CPU: the plan's ra_call_stream, polled between tiles */
    ra_dyn_io dyn;
    const float *sinks;   /* [H] or NULL: SPEC 11, joined into each row at its finalise (last) */
} ra_fwd_io;

/*
 * The backward's prologue, once per call (SPEC 7 and 9): D_i = dot(dO_i, O_i) of every local
 * query row, and the shift and scale of its P = exp(s - shift) * scale: (LSE, 1), or (m, 1/l)
 * from the recomputed stats where LSE is lossy.
 */
typedef struct ra_bwd_prologue_io {
    const ra_view *o, *dout;
    const float *lse;
    const float *row_m, *row_l; /* [H, query rows] recomputed stats, or NULL: none lossy */
    void *stream;
    /* SPEC 11: the sinks [H] (they join a lossy row's recomputed (m, l)) and, when dsinks is
       not NULL, their gradient [H] over the local rows; dlse [H, query rows] or NULL: the
       LSE's gradient, D_i - dlse_i in place of D_i */
    const float *sinks, *dlse;
    float *dsinks;
} ra_bwd_prologue_io;

/*
 * One backward step (SPEC 7): the local queries against one key shard. Outputs are overwritten
 * in the plan's dtype, or, with accumulate set, are float32 sums added to (ring steps). The
 * prologue's results are read from the workspace.
 */
typedef struct ra_bwd_io {
    const ra_view *q, *k, *v, *dout;
    const float *lse;
    const ra_shard *keys;
    const ra_view *dq, *dk, *dv;
    int accumulate;
    int scale_q_first;
    void *stream;
    ra_dyn_io dyn;
} ra_bwd_io;

/* The tile list of the local queries against key shard `keys` (one of the params'). */
static inline const ra_tile_list *ra__key_tiles(const ra_kernel_params *p, const ra_shard *keys)
{
    return &p->key_tiles[keys - p->key_shards];
}

/*
 * SPEC 9: below this |LSE|, float32 rounding moves LSE by at most 2^-17, so P = exp(s - LSE) is
 * within a relative 7.6e-6; at or above it log(l) may not survive in LSE (a row of logits all
 * near -1e30 has LSE = its max), and the backward recomputes the row's max and sum instead.
 */
#define RA_LSE_LOSSY 256.0f

RA_HD int ra__lse_lossy(float lse) { return isfinite(lse) && fabsf(lse) >= RA_LSE_LOSSY; }

/*
 * SPEC 2 and 9: the factor of the raw product q . k in the logit: the scale, or with a softcap
 * scale / softcap, the tanh's argument. Folded before the product (or the scale of Q first), so
 * that nothing overflows where the tanh's argument does not: with q and k entries of 1.5e19 at
 * D = 16, scale 0.25 and softcap 5 the scaled products' partial sums overflowed 6.7% of the rows.
 */
static inline float ra__logit_scale(const ra_kernel_params *p)
{
    return p->softcap > 0.0f ? p->scale / p->softcap : p->scale;
}

#endif
