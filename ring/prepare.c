/*
 * A call's decisions before the ring starts (ring.h): the key bias of every shard, gathered
 * once on the control plane rather than carried behind each K/V shard; the SPEC 6 thresholds;
 * and which steps compute, so that no step reads an exchange buffer to decide.
 */
#include <math.h>

#include "base/error.h"
#include "base/log.h"
#include "comm/comm.h"
#include "masks/topk.h"
#include "plan/buffers.h"
#include "plan/select.h"
#include "ring/ring.h"

/* Every shard's bias into b->host_bias (shard after shard), then into the backend's copy. */
static ringattn_status_t gather_bias(struct ringattn_plan *p, ra_buffers *b)
{
    RA_TRY(ra__comm_allgather(p->comm, b->host_own_bias, b->host_bias, b->bias_bytes));
    return ra__plan_from_host(p, b->bias, b->host_bias,
                              (size_t)b->bias_at[p->ranks] * sizeof(float));
}

/* The gathered bias in global token order (the selection ranks whole sequences). */
static void bias_to_global(const struct ringattn_plan *p, const ra_buffers *b)
{
    const int Hb = p->kp.bias_heads;
    const int64_t total = p->cu_q[p->kp.num_seqs];
    for (int r = 0; r < p->ranks; ++r) {
        const ra_shard *sh = &p->shards[r];
        const float *src = b->host_bias + b->bias_at[r];
        for (int i = 0; i < sh->num_segs; ++i) {
            const ra_segment *seg = &sh->segs[i];
            for (int hb = 0; hb < Hb; ++hb)
                for (int64_t j = 0; j < seg->span.count; ++j)
                    b->host_global[hb * total + ra__segment_global(seg, p->cu_q, j)] =
                        src[hb * sh->rows + seg->row + j];
        }
    }
}

/*
 * SPEC 6 step skipping: does some local row keep some key of shard s (its gathered bias)?
 * When, for every bias head, the shard's largest bias is below every local row's threshold, no
 * row keeps any of its keys, and the step's compute is skipped exactly (each of its tiles
 * would be skipped the same way, one check per tile). The K/V still travel on.
 */
static int shard_kept(const struct ringattn_plan *p, const ra_thresholds *thr, int s)
{
    const float *bias = p->buf->host_bias + p->buf->bias_at[s];
    const int64_t rows = p->shards[s].rows;
    for (int hb = 0; hb < p->kp.bias_heads; ++hb) {
        float bmax = -INFINITY;
        for (int64_t j = 0; j < rows; ++j) bmax = fmaxf(bmax, bias[hb * rows + j]);
        if (ra__topk_block_kept(bmax, thr->lowest[hb])) return 1;
    }
    ra__log(RA_LOG_DEBUG, RA_SUB_RING, p->rank, p->ranks,
            "top-k: no local row keeps a key of shard %d: step skipped", s);
    return 0;
}

/* Which steps compute (see ra__ring_prepare); returns the schedule's last compute step. */
static int decide_steps(struct ringattn_plan *p, const ra_thresholds *thr, int backward)
{
    ra_buffers *b = p->buf;
    int last = 0;
    for (int t = 0; t < p->num_steps; ++t)
        if (p->step_compute[t]) last = t;
    for (int t = 0; t < p->num_steps; ++t) {
        const int s = ra__held_shard(p, p->rank, t);
        const int always = p->ranks == 1 || (!backward && (t == 0 || t == last));
        b->run[t] = p->step_compute[t] &&
                    (always || !thr->b || shard_kept(p, thr, s));
    }
    return last;
}

ringattn_status_t ra__ring_prepare(struct ringattn_plan *p, const ra_call *c, int backward,
                                   ra_prepared *out)
{
    ra_buffers *b = p->buf;
    const int ring = p->ranks > 1;
    ra_thresholds thr = {NULL, NULL, NULL};
    *out = (ra_prepared){NULL, NULL, NULL, b->run, 0};
    if (p->kp.bias_heads) {
        /* the local bias is in b->host_own_bias already: api/calls.c checked it there */
        if (ring) RA_TRY(gather_bias(p, b));
        out->bias = ring ? b->bias : c->a.key_bias;
    }
    if (p->kp.selects) {
        if (ring) bias_to_global(p, b);
        RA_TRY(ra__select_thresholds(p, ring ? b->host_global : b->host_own_bias, &thr));
        const size_t n = (size_t)p->kp.bias_heads * (size_t)p->kp.queries->rows;
        RA_TRY(ra__plan_from_host(p, b->thr_b, thr.b, n * sizeof *thr.b));
        RA_TRY(ra__plan_from_host(p, b->thr_p, thr.p, n * sizeof *thr.p));
        out->thr_b = b->thr_b;
        out->thr_p = b->thr_p;
    }
    out->last = decide_steps(p, &thr, backward);
    return RINGATTN_SUCCESS;
}

ra_dyn_io ra__ring_dyn_io(const struct ringattn_plan *p, const ra_prepared *pr, int t,
                          float *dbias)
{
    const int s = ra__held_shard(p, p->rank, t);
    const int64_t at = p->ranks > 1 ? p->buf->bias_at[s] : 0;
    const ra_dyn_io d = {pr->bias ? pr->bias + at : NULL, p->shards[s].rows, pr->thr_b, pr->thr_p,
                         dbias};
    return d;
}
