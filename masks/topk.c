/* SPEC 6 top-k thresholds (see topk.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "masks/topk.h"

/* Does x rank before y: bias descending, then position ascending (a strict total order). */
static inline int before(ra_topk_key x, ra_topk_key y)
{
    return x.bias > y.bias || (x.bias == y.bias && x.pos < y.pos);
}

/*
 * Restores the heap property (the last in rank order on top) below node i of a[0..n). Indices
 * are int64: a node past 2^30 has its children's index 2i + 1 past INT32_MAX (sequences of up
 * to INT32_MAX keys, SPEC 1's int32 cu_seqlens).
 */
void ra__topk_sift_down(ra_topk_key *a, int32_t node, int32_t n)
{
    const ra_topk_key x = a[node];
    int64_t i = node;
    for (int64_t c; (c = 2 * i + 1) < n; i = c) {
        if (c + 1 < n && before(a[c], a[c + 1])) ++c;
        if (!before(x, a[c])) break;
        a[i] = a[c];
    }
    a[i] = x;
}

/* A heap sort: in place and allocation-free (qsort may malloc), O(n log n). The order is a
   total order on distinct positions, so the result is the one sorted order whatever the sort. */
void ra__topk_order(const float *bias, int32_t n, ra_topk_key *order)
{
    for (int32_t p = 0; p < n; ++p) order[p] = (ra_topk_key){bias[p], p};
    for (int32_t i = n / 2 - 1; i >= 0; --i) ra__topk_sift_down(order, i, n);
    for (int32_t end = n - 1; end > 0; --end) {
        const ra_topk_key top = order[0];
        order[0] = order[end];
        order[end] = top;
        ra__topk_sift_down(order, 0, end);
    }
}

void ra__topk_rank(const float *bias, int32_t n, ra_topk_key *order, int32_t *rank)
{
    ra__topk_order(bias, n, order);
    for (int32_t r = 0; r < n; ++r) rank[order[r].pos] = r;
}

/*
 * Fenwick tree over ranks 1..n counting the keys in the current window. Indices are int64: past
 * 2^30 ranks, i + lowbit(i) and the search's pos + step exceed INT32_MAX (counts fit int32).
 */
void ra__topk_fen_add(int32_t *fen, int32_t n, int32_t rank, int32_t d)
{
    for (int64_t i = (int64_t)rank + 1; i <= n; i += i & -i) fen[i] += d;
}

/* Smallest rank r such that the window holds k keys of rank <= r (1 <= k <= count). */
int32_t ra__topk_fen_kth(const int32_t *fen, int32_t n, int32_t k)
{
    int64_t pos = 0, step = 1;
    while (step * 2 <= n) step *= 2;
    for (; step > 0; step /= 2)
        if (pos + step <= n && fen[pos + step] < k) {
            pos += step;
            k -= fen[pos];
        }
    return (int32_t)pos; /* 0-based rank, < n */
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
        while (hi_in < hi) ra__topk_fen_add(fen, n, rank[++hi_in], 1);
        while (lo_in < lo) ra__topk_fen_add(fen, n, rank[lo_in++], -1);
        if (hi - lo + 1 <= keep_k) {
            thr_b[a] = -INFINITY;
            thr_p[a] = INT64_MAX;
            continue;
        }
        const ra_topk_key *kth = &order[ra__topk_fen_kth(fen, n, keep_k)];
        thr_b[a] = kth->bias;
        thr_p[a] = kth->pos;
    }
}
