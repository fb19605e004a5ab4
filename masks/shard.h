/*
 * A shard: the tokens one rank holds, as segments (a span of one sequence plus the local row
 * where it starts), sorted by sequence. The single-rank plan's queries and keys are shards of
 * one segment per sequence; plan/layout.c makes them (SPEC 8). Internal.
 */
#ifndef RINGATTN_MASKS_SHARD_H
#define RINGATTN_MASKS_SHARD_H

#include <stdint.h>

#include "masks/mask.h"

typedef struct ra_segment {
    ra_span span; /* positions within its sequence */
    int64_t row;  /* local row of its first token */
} ra_segment;

typedef struct ra_shard {
    int num_segs;
    ra_segment *segs;
    int32_t *seq_first; /* [num_seqs + 1]: segments of sequence s are [seq_first[s], seq_first[s+1]) */
    int64_t rows;
} ra_shard;

/* The tile [t0, t0 + block) of segment seg's tokens, cut at its end: its positions (a span);
   its first local row is seg->row + t0. Every tile walk of both backends cuts tiles so. */
RA_HD ra_span ra__segment_tile(const ra_segment *seg, int64_t t0, int64_t block)
{
    const int64_t left = seg->span.count - t0;
    ra_span s;
    s.seq = seg->span.seq;
    s.pos = seg->span.pos + t0 * seg->span.stride;
    s.stride = seg->span.stride;
    s.count = left < block ? left : block;
    return s;
}

/* Index in the packed global batch (boundaries cu) of token j of segment seg. */
static inline int64_t ra__segment_global(const ra_segment *seg, const int32_t *cu, int64_t j)
{
    return cu[seg->span.seq] + seg->span.pos + j * seg->span.stride;
}

/* Global index (into the packed batch of boundaries cu) of every row of shard sh, in row
   order: global_index has sh->rows entries. */
static inline void ra__shard_global_index(const ra_shard *sh, const int32_t *cu,
                                          int32_t *global_index)
{
    for (int i = 0; i < sh->num_segs; ++i) {
        const ra_segment *seg = &sh->segs[i];
        for (int64_t j = 0; j < seg->span.count; ++j)
            global_index[seg->row + j] = (int32_t)ra__segment_global(seg, cu, j);
    }
}

#endif
