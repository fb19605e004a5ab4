/* The plan as built: a validated, owned copy of the descriptor plus derived values. Internal. */
#ifndef RINGATTN_RING_PLAN_PLAN_H
#define RINGATTN_RING_PLAN_PLAN_H

#include <stdint.h>

#include "kernels/kernel_ops.h"
#include "masks/mask.h"
#include "masks/shard.h"
#include "ringattn.h"

#define RA_MAX_HEAD_DIM 256

struct ringattn_plan {
    ringattn_plan_desc_t desc; /* pointers inside are cleared; use the owned copies below */
    int num_heads, num_kv_heads, head_dim, head_dim_v;
    ringattn_dtype_t dtype;
    int num_seqs;
    int32_t *cu_q, *cu_k;     /* owned, [num_seqs + 1] */
    int64_t total_q, total_k; /* rows of Q/O and of K/V that are read */
    ra_shard q_shard, k_shard; /* the local queries and keys as segments */
    int64_t *delta;           /* [num_seqs] SPEC 2 delta = L_k - L_q (bottom-right alignment) */
    ra_window window;         /* SPEC 3, causal folded in */
    float scale, softcap;
    float *alibi;             /* owned [num_heads] or NULL */
    int bias_heads, keep_k;   /* SPEC 6 dynamic mask: H_b (0 = no bias), top-k (0 = none) */
    int32_t longest_k;        /* keys of the longest sequence */
    int selects;              /* keep_k drops keys somewhere: 0 < keep_k < longest_k */
    int block_q, block_k, num_threads;
    /* The ring: a single-rank plan has comm == NULL, ranks == 1, shards == NULL. */
    ringattn_comm_t comm;
    int rank, ranks;
    ringattn_layout_t layout;
    ra_shard *shards;            /* [ranks] every rank's tokens (SPEC 8) */
    int num_steps;               /* ring steps: 1 + the longest journey of any shard */
    unsigned char *step_compute; /* [ranks] does this rank compute at step t (EMPTY skipped) */
    int *last_hop;               /* [ranks] shard s travels s -> s+1 -> ... -> s+last_hop[s] */
    struct ra_ring *ring;        /* exchange buffers and running state, made on first use */
    struct ra_select *select;    /* SPEC 6 top-k thresholds and scratch, made on first use */
    const struct ra_kernel_ops *kops;
    struct ra_workspace *ws;  /* the backend's, made on first use, freed with the plan */
};

/* Is plan a live plan made by ringattn_plan_create (not destroyed)? Safe on any pointer. */
int ra__plan_is_live(const struct ringattn_plan *plan);

#endif
