/*
 * The KV cache driver (plan/cache.h): every query against this rank's cache slots in place
 * (and, on the last rank, the new tokens' K/V), one float32 partial, the partials' gather
 * around the ring and their SPEC 5 merge, in rank order, on every rank. No K/V moves.
 */
#include "base/error.h"
#include "comm/comm.h"
#include "plan/buffers.h"
#include "plan/cache.h"
#include "plan/select.h"
#include "ring/ring.h"

/* A shard's bias ([H_b, its rows] at src) into the selection's input, in key order over every
   key of a sequence, cached then new (cu_k). */
static void bias_to_keys(const struct ringattn_plan *p, const ra_shard *sh, const float *src)
{
    const int64_t total = p->cu_k[p->kp.num_seqs];
    for (int i = 0; i < sh->num_segs; ++i) {
        const ra_segment *seg = &sh->segs[i];
        for (int hb = 0; hb < p->kp.bias_heads; ++hb)
            for (int64_t j = 0; j < seg->span.count; ++j)
                p->buf->host_global[hb * total + ra__segment_global(seg, p->cu_k, j)] =
                    src[hb * sh->rows + seg->row + j];
    }
}

/*
 * SPEC 6 over the whole cache: every rank's bias (gathered on the control plane; the local and
 * new tokens' are on the host already, checked by api/calls.c) ranks the keys of each sequence,
 * and the thresholds of every query reach the kernels. Collective with a comm.
 */
static ringattn_status_t select_over_cache(struct ringattn_plan *p, ra_thresholds *thr)
{
    ra_buffers *b = p->buf;
    const float *all = b->host_own_bias;
    if (p->ranks > 1) {
        RA_TRY(ra__comm_allgather(p->comm, b->host_own_bias, b->host_bias, b->bias_bytes));
        all = b->host_bias;
    }
    for (int r = 0; r < p->ranks; ++r) bias_to_keys(p, &p->shards[r], all + b->bias_at[r]);
    const int64_t at = b->bias_at[p->ranks - 1] + p->kp.bias_heads * p->shards[p->ranks - 1].rows;
    if (p->new_shard >= 0) bias_to_keys(p, &p->shards[p->new_shard], all + at);
    RA_TRY(ra__select_thresholds(p, b->host_global, thr));
    const size_t n = (size_t)p->kp.bias_heads * (size_t)p->queries.rows;
    RA_TRY(ra__plan_from_host(p, b->thr_b, thr->b, n * sizeof *thr->b));
    return ra__plan_from_host(p, b->thr_p, thr->p, n * sizeof *thr->p);
}

/* Every query against one key source (this rank's cache slots, or the new tokens'). */
static ringattn_status_t attend(struct ringattn_plan *p, const ra_call *c, const ra_view *k,
                                const ra_view *v, const ra_shard *keys, const float *bias,
                                int first)
{
    const ra_buffers *b = p->buf;
    ra_fwd_io io = {.q = &c->a.q, .k = k, .v = v, .keys = keys, .o = &c->a.o, .lse = c->a.lse,
                    .m = b->m, .l = b->l, .acc = b->acc, .first = first, .last = 0,
                    .scale_q_first = c->scale_q_first, .stream = &p->stream};
    io.dyn = (ra_dyn_io){bias, keys->rows, p->kp.selects ? b->thr_b : NULL,
                         p->kp.selects ? b->thr_p : NULL, NULL};
    return p->be->attend_forward(p->ws, &p->kp, &io);
}

/* The gather: at hop t the partial of rank r - t moves on to r + 1, the one of r - 1 - t comes
   in; an empty partial (part_slot -1) is no message. */
static ringattn_status_t gather_parts(struct ringattn_plan *p)
{
    const ra_buffers *b = p->buf;
    const int prev = (p->rank - 1 + p->ranks) % p->ranks;
    ringattn_status_t st = RINGATTN_SUCCESS;
    for (int t = 0; t + 1 < p->ranks && st == RINGATTN_SUCCESS; ++t) {
        const int out = p->part_slot[ra__cache_held_part(p, p->rank, t)];
        const int in = p->part_slot[ra__cache_held_part(p, prev, t)];
        ra_exchange x = {.step = t};
        x.send[0] = (ra_msg){b->parts + (out >= 0 ? (size_t)out * b->part_floats : 0),
                             out >= 0 ? ra__cache_part_bytes(p) : 0, (p->rank + 1) % p->ranks};
        x.recv[0] = (ra_msg){b->parts + (in >= 0 ? (size_t)in * b->part_floats : 0),
                             in >= 0 ? ra__cache_part_bytes(p) : 0, prev};
        RA_TRY(ra__comm_start(p->comm, &x, &p->stream));
        st = ra__comm_wait(p->comm, &x);
    }
    return st;
}

/* A compute failure on this rank still takes part in the gather, so that no peer waits for it
   (DESIGN, failure semantics): the call's conclusion then fails on every rank. */
ringattn_status_t ra__cache_forward(struct ringattn_plan *p, const ra_call *c)
{
    const ra_buffers *b = p->buf;
    ra_thresholds thr;
    ringattn_status_t st = p->kp.selects ? select_over_cache(p, &thr) : RINGATTN_SUCCESS;
    const int slot = p->part_slot[p->ranks > 1 ? p->rank : 0];
    if (st == RINGATTN_SUCCESS && p->cache_meets)
        st = attend(p, c, &c->a.k, &c->a.v, ra__local_keys(p), c->a.key_bias, 1);
    if (st == RINGATTN_SUCCESS && p->new_meets)
        st = attend(p, c, &c->a.k_new, &c->a.v_new, &p->shards[p->new_shard], c->a.key_bias_new,
                    !p->cache_meets);
    if (st == RINGATTN_SUCCESS && slot >= 0) {
        const ra_fwd_io io = {.m = b->m, .l = b->l, .acc = b->acc, .stream = &p->stream};
        st = p->be->state_partial(p->ws, &p->kp, &io, b->parts + (size_t)slot * b->part_floats);
    }
    if (p->ranks > 1) {
        const ringattn_status_t gathered = gather_parts(p);
        if (st == RINGATTN_SUCCESS) st = gathered;
    }
    RA_TRY(st);
    return p->be->merge_f32(&p->kp, b->parts, p->live_parts, b->part_floats, c->a.sinks, &c->a.o,
                            c->a.lse, &p->stream);
}
