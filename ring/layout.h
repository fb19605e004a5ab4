/*
 * SPEC 8 sequence-parallel layouts: which tokens of each sequence a rank holds. Internal.
 * A rank holds, for each sequence in order, one or two spans (masks/mask.h) of it; its local
 * rows are those spans laid end to end.
 */
#ifndef RINGATTN_RING_LAYOUT_H
#define RINGATTN_RING_LAYOUT_H

#include <stdint.h>

#include "masks/mask.h"
#include "ringattn.h"

#define RA_LAYOUT_MAX_SPANS 2 /* spans of one sequence on one rank (zigzag: 2) */

/*
 * The spans of sequence seq (length len) that rank r of P holds under layout; returns their
 * number (spans of zero tokens are left out). Unequal chunks: the first len % n of the n chunks
 * hold one token more.
 */
int ra__layout_spans(ringattn_layout_t layout, int P, int r, int32_t seq, int64_t len,
                     ra_span out[RA_LAYOUT_MAX_SPANS]);

#endif
