/*
 * SPEC 8 sequence-parallel layouts: which tokens of each sequence a rank holds. Internal.
 * A rank holds, for each sequence in order, one or two spans (masks/mask.h) of it; its local
 * rows are those spans laid end to end.
 */
#ifndef RINGATTN_PLAN_LAYOUT_H
#define RINGATTN_PLAN_LAYOUT_H

#include <stdint.h>

#include "masks/mask.h"
#include "masks/shard.h"
#include "ringattn.h"

#define RA_LAYOUT_MAX_SPANS 2 /* spans of one sequence on one rank (zigzag: 2) */

/*
 * The spans of sequence seq (length len) that rank r of P holds under layout; returns their
 * number (spans of zero tokens are left out). Unequal chunks: the first len % n of the n chunks
 * hold one token more.
 */
int ra__layout_spans(ringattn_layout_t layout, int P, int r, int32_t seq, int64_t len,
                     ra_span out[RA_LAYOUT_MAX_SPANS]);

/* The shard of rank r of P under layout (SPEC 8) of the sequences in cu[num_seqs + 1]. With
   P = 1 this is one segment per non-empty sequence at row cu[s]. */
ringattn_status_t ra__shard_make(ringattn_layout_t layout, int P, int r, const int32_t *cu,
                                 int num_seqs, ra_shard *out);
/* A KV cache's shards (plan/cache.c): rank r's slots of every sequence by the
   descriptor's cache_bounds ([num_seqs * (P + 1)]), and the new tokens' keys, each sequence's
   after its cu_cache keys (rows: the packed batch of cu_new). */
ringattn_status_t ra__shard_make_bounds(const int32_t *bounds, int P, int r, int num_seqs,
                                        ra_shard *out);
ringattn_status_t ra__shard_make_new(const int32_t *cu_cache, const int32_t *cu_new, int num_seqs,
                                     ra_shard *out);
void ra__shard_free(ra_shard *sh);

#endif
