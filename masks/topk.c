/* SPEC 6 top-k thresholds (see topk.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "masks/topk.h"

static int by_rank(const void *a, const void *b)
{
    const ra_topk_key *x = a, *y = b;
    if (x->bias != y->bias) return x->bias > y->bias ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

void ra__topk_order(const float *bias, int32_t n, ra_topk_key *order)
{
    for (int32_t p = 0; p < n; ++p) order[p] = (ra_topk_key){bias[p], p};
    qsort(order, (size_t)n, sizeof *order, by_rank);
}

void ra__topk_rank(const float *bias, int32_t n, ra_topk_key *order, int32_t *rank)
{
    ra__topk_order(bias, n, order);
    for (int32_t r = 0; r < n; ++r) rank[order[r].pos] = r;
}

/* Fenwick tree over ranks 1..n counting the keys in the current window. */
static void fen_add(int32_t *fen, int32_t n, int32_t i, int32_t d)
{
    for (++i; i <= n; i += i & -i) fen[i] += d;
}

/* Smallest rank r such that the window holds k keys of rank <= r (1 <= k <= count). */
static int32_t fen_kth(const int32_t *fen, int32_t n, int32_t k)
{
    int32_t pos = 0, step = 1;
    while (step * 2 <= n) step *= 2;
    for (; step > 0; step /= 2)
        if (pos + step <= n && fen[pos + step] < k) {
            pos += step;
            k -= fen[pos];
        }
    return pos; /* 0-based rank */
}

void ra__topk_thresholds(ra_window w, int64_t delta, const ra_topk_key *order,
                         const int32_t *rank, int32_t n, int keep_k, const ra_span *q,
                         int32_t *fen, float *thr_b, int64_t *thr_p)
{
    memset(fen, 0, ((size_t)n + 1) * sizeof *fen);
    int64_t lo_in = 0, hi_in = -1; /* keys [lo_in, hi_in] are in the tree */
    for (int64_t a = 0; a < q->count; ++a) {
        const int64_t p = q->pos + a * q->stride;
        int64_t lo = w.left >= 0 ? p + delta - w.left : 0;
        int64_t hi = w.right >= 0 ? p + delta + w.right : n - 1;
        lo = lo < 0 ? 0 : lo;
        hi = hi > n - 1 ? n - 1 : hi;
        if (hi < lo) { /* no valid key: nothing to keep */
            thr_b[a] = INFINITY;
            thr_p[a] = -1;
            continue;
        }
        while (hi_in < hi) fen_add(fen, n, rank[++hi_in], 1);
        while (lo_in < lo) fen_add(fen, n, rank[lo_in++], -1);
        if (hi - lo + 1 <= keep_k) {
            thr_b[a] = -INFINITY;
            thr_p[a] = INT64_MAX;
            continue;
        }
        const ra_topk_key *kth = &order[fen_kth(fen, n, keep_k)];
        thr_b[a] = kth->bias;
        thr_p[a] = kth->pos;
    }
}
