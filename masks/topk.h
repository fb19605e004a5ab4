/*
 * SPEC 6 selection: row i keeps key j iff j is valid (SPEC 3) and among the keep_k valid keys of
 * largest bias (ties: lower position wins). Ranking the keys of a sequence once by (bias
 * descending, position ascending) turns this into a per-row threshold (tb, tp): keep j iff
 * b_j > tb or (b_j == tb and p_j <= tp). Computed exactly in O(L log L) per sequence and bias
 * head with a Fenwick tree over ranks swept along the rows' valid windows. Internal.
 */
#ifndef RINGATTN_MASKS_TOPK_H
#define RINGATTN_MASKS_TOPK_H

#include <stdint.h>

#include "masks/mask.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The rule itself, the one definition both backends use (RA_HD code and SIMD loops alike, any
   integer width of positions): key (b, p) is kept by a row of threshold (tb, tp). Branch-free,
   so that the CPU's loop vectorises. */
#define RA_TOPK_KEEPS(b, p, tb, tp) (((b) > (tb)) | (((b) == (tb)) & ((p) <= (tp))))

/* SPEC 6 skipping, the one definition of ring/prepare.c and both backends: some row whose
   threshold bias is at least tmin may keep some key of a block (a tile, a shard) whose largest
   bias is bmax, unless bmax < tmin; then no row keeps any, and the block is skipped exactly.
   NaN keeps the block. */
RA_HD int ra__topk_block_kept(float bmax, float tmin) { return !(bmax < tmin); }

typedef struct ra_topk_key {
    float bias;
    int32_t pos;
} ra_topk_key;

/* Sorts n keys (bias[p] at position p) into order[] by rank: bias descending, then position. */
void ra__topk_order(const float *bias, int32_t n, ra_topk_key *order);

/* ra__topk_order for the keys of one sequence, and rank[p] (0 = best). */
void ra__topk_rank(const float *bias, int32_t n, ra_topk_key *order, int32_t *rank);

/*
 * Thresholds of the queries of span q (positions in the same sequence) against its n keys:
 * thr_b[a], thr_p[a] for query a. A row with at most keep_k valid keys keeps them all
 * (-inf, INT64_MAX). fen: scratch of n + 1 entries.
 */
void ra__topk_thresholds(ra_window w, int64_t delta, const ra_topk_key *order,
                         const int32_t *rank, int32_t n, int keep_k, const ra_span *q,
                         int32_t *fen, float *thr_b, int64_t *thr_p);

/* The pieces of the sweep and the sort, exposed for tests at lengths past 2^30. */
void ra__topk_sift_down(ra_topk_key *a, int32_t node, int32_t n);
void ra__topk_fen_add(int32_t *fen, int32_t n, int32_t rank, int32_t d);
int32_t ra__topk_fen_kth(const int32_t *fen, int32_t n, int32_t k);

#ifdef __cplusplus
}
#endif

#endif
