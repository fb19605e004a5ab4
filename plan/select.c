/*
 * SPEC 6 global selection: thresholds of the local queries, each over the keys of its whole
 * sequence (not per shard), in O(L log L) per sequence and bias head (masks/topk.c). The
 * buffers are the plan's, made at plan creation.
 */
#include <math.h>
#include <stdlib.h>

#include "masks/topk.h"
#include "base/error.h"
#include "plan/select.h"

struct ra_select {
    float *thr_b, *lowest;
    int64_t *thr_p;
    ra_topk_key *order;
    int32_t *rank, *fen;
};

void ra__select_free(struct ra_select *s)
{
    if (!s) return;
    free(s->thr_b);
    free(s->lowest);
    free(s->thr_p);
    free(s->order);
    free(s->rank);
    free(s->fen);
    free(s);
}

ringattn_status_t ra__select_make(struct ringattn_plan *p)
{
    if (!p->kp.selects) return RINGATTN_SUCCESS;
    const int32_t longest = p->longest_k;
    const int Hb = p->kp.bias_heads;
    const size_t rows = (size_t)Hb * (size_t)p->kp.queries->rows + 1;
    struct ra_select *s = calloc(1, sizeof *s);
    if (!s || !(s->thr_b = malloc(rows * sizeof *s->thr_b)) ||
        !(s->lowest = malloc((size_t)Hb * sizeof *s->lowest)) ||
        !(s->thr_p = malloc(rows * sizeof *s->thr_p)) ||
        !(s->order = malloc((size_t)longest * sizeof *s->order)) ||
        !(s->rank = malloc((size_t)longest * sizeof *s->rank)) ||
        !(s->fen = malloc(((size_t)longest + 1) * sizeof *s->fen))) {
        ra__select_free(s);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "ringattn: out of memory (top-k selection)");
    }
    p->host_bytes += rows * (sizeof *s->thr_b + sizeof *s->thr_p) + Hb * sizeof *s->lowest +
                     (size_t)longest * (sizeof *s->order + sizeof *s->rank + sizeof *s->fen);
    p->select = s;
    return RINGATTN_SUCCESS;
}

ringattn_status_t ra__select_thresholds(struct ringattn_plan *p, const float *global_bias,
                                        ra_thresholds *out)
{
    *out = (ra_thresholds){NULL, NULL, NULL};
    if (!p->kp.selects) return RINGATTN_SUCCESS;
    struct ra_select *sel = p->select;
    const ra_shard *q = p->kp.queries;
    const int64_t total_k = p->cu_k[p->kp.num_seqs], rows = q->rows;
    for (int hb = 0; hb < p->kp.bias_heads; ++hb) {
        for (int s = 0; s < p->kp.num_seqs; ++s) {
            const int32_t first = q->seq_first[s], last = q->seq_first[s + 1];
            if (first == last) continue; /* no local query of this sequence */
            const int32_t n = p->cu_k[s + 1] - p->cu_k[s];
            ra__topk_rank(global_bias + hb * total_k + p->cu_k[s], n, sel->order, sel->rank);
            for (int32_t i = first; i < last; ++i) {
                const ra_segment *seg = &q->segs[i];
                const int64_t at = hb * rows + seg->row;
                ra__topk_thresholds(p->kp.window, p->delta[s], sel->order, sel->rank, n,
                                    p->keep_k, &seg->span, sel->fen, sel->thr_b + at,
                                    sel->thr_p + at);
            }
        }
    }
    for (int hb = 0; hb < p->kp.bias_heads; ++hb) {
        float lowest = INFINITY;
        for (int64_t i = 0; i < rows; ++i) lowest = fminf(lowest, sel->thr_b[hb * rows + i]);
        sel->lowest[hb] = lowest;
    }
    *out = (ra_thresholds){sel->thr_b, sel->thr_p, sel->lowest};
    return RINGATTN_SUCCESS;
}
