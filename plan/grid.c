/*
 * 2D plans made and freed (plan/grid.h). Creation checks and agrees on the descriptor over
 * the whole grid before anything is made, so that every later step either succeeds on every
 * rank or fails on every rank for a resource (memory), which the closing agreement over both
 * comms tells them all.
 */
#include <stdlib.h>
#include <string.h>

#include "base/abi.h"
#include "base/dtype.h"
#include "base/error.h"
#include "base/log.h"
#include "base/registry.h"
#include "comm/comm.h"
#include "plan/agree.h"
#include "plan/check.h"
#include "plan/grid.h"
#include "plan/info.h"
#include "plan/kind.h"
#include "plan/plan.h"

/* What a rank can check alone: the descriptor (plan/check.c) and its split into head shards. */
static ringattn_status_t check_grid(const char *fn, ringattn_comm_t memory_comm, int pu,
                                    const ringattn_plan_desc_t *caller, ringattn_plan_desc_t *d,
                                    const struct ra_backend **be)
{
    if (!caller) return ra__desc_check(memory_comm, caller, d, be); /* its message */
    ringattn_plan_desc_t in;
    RA_TRY(ra__desc_in(fn, caller, &in));
    /* a sharded cache's bounds are per group ([num_seqs (P_r + 1)]): the inner plan checks
       and agrees on them over the ring comm */
    const int32_t *bounds = in.cache_bounds;
    in.cache_bounds = NULL;
    RA_TRY(ra__desc_check(memory_comm, &in, d, be));
    d->cache_bounds = bounds;
    const int H = d->num_heads, Hk = d->num_kv_heads ? d->num_kv_heads : H;
    RA_CHECK(d->ulysses_size == 0 || d->ulysses_size == 1 || d->ulysses_size == pu,
             RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: desc.ulysses_size: got %d, expected 0 or %d (the group comm's size)", fn,
             d->ulysses_size, pu);
    RA_CHECK(pu <= RA_GRID_MAX_GROUP, RINGATTN_ERR_UNSUPPORTED,
             "%s: ulysses_size: got %d, expected at most %d ranks in a group", fn, pu,
             RA_GRID_MAX_GROUP);
    RA_CHECK(H % pu == 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: num_heads: got %d, expected a multiple of ulysses_size = %d (each rank of a "
             "group attends num_heads / ulysses_size query heads)", fn, H, pu);
    RA_CHECK(Hk % pu == 0 || pu % Hk == 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: num_kv_heads: got %d, expected a multiple or a divisor of ulysses_size = %d "
             "(kv heads are split across the group, or each replicated on ulysses_size / "
             "num_kv_heads ranks)", fn, Hk, pu);
    RA_CHECK(d->sharded_cache || !d->cu_seqlens_k || !memcmp(d->cu_seqlens_k, d->cu_seqlens,
                                         ((size_t)d->num_seqs + 1) * sizeof(int32_t)),
             RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: cu_seqlens_k: got other boundaries than cu_seqlens, expected NULL or the same "
             "(in a 2D training plan queries and keys are the same tokens; a KV cache needs "
             "sharded_cache)", fn);
    return RINGATTN_SUCCESS;
}

/* The inner ring's descriptor: this rank's head shard of the group's tokens. */
static ringattn_plan_desc_t inner_desc(const ra_grid *g, const ringattn_plan_desc_t *d)
{
    ringattn_plan_desc_t in = *d;
    in.num_heads = g->each[RA_HEADS_Q];
    in.num_kv_heads = g->each[RA_HEADS_KV];
    in.key_bias_heads = d->key_bias_heads ? g->each[RA_HEADS_BIAS] : 0;
    const int first = ra__grid_first_head(g, RA_HEADS_Q, g->member);
    in.alibi_slopes = d->alibi_slopes ? d->alibi_slopes + first : NULL;
    in.ulysses_size = 0;
    return in;
}

static void *grid_alloc(const struct ra_backend *be, ra_grid *g, size_t bytes,
                        ringattn_status_t *st)
{
    void *ptr = NULL;
    if (*st != RINGATTN_SUCCESS || bytes == 0) return NULL;
    *st = be->memory->alloc(bytes, &ptr);
    g->bytes += *st == RINGATTN_SUCCESS ? bytes : 0;
    return ptr;
}

/*
 * The inner plan's tensors over the group's tokens, and the all-to-all's staging: a send and a
 * receive slot per member, and an accumulator where replicated heads are summed, each of the
 * largest piece's rows at the widest row a staged tensor has (plan/grid.h).
 */
static ringattn_status_t grid_buffers(const struct ra_backend *be, ra_grid *g,
                                      const ringattn_plan_desc_t *d)
{
    const size_t N = (size_t)g->rows, es = ra__dtype_size(d->dtype), f = sizeof(float);
    const size_t D = (size_t)d->head_dim;
    const size_t Dv = d->head_dim_v ? (size_t)d->head_dim_v : D;
    const size_t hq = (size_t)g->each[RA_HEADS_Q], hk = (size_t)g->each[RA_HEADS_KV];
    const size_t hb = d->key_bias_heads ? (size_t)g->each[RA_HEADS_BIAS] : (size_t)0;
    const size_t gk = ra__grid_replicated(g, RA_HEADS_KV) ? f : es; /* dK, dV summed in f32 */
    ringattn_status_t st = RINGATTN_SUCCESS;
    if (g->cache) { /* the caller's tensors are the inner plan's; O and LSE heads gathered */
        g->stage_bytes = N * hq * (Dv * es > f ? Dv * es : f);
        g->stage = grid_alloc(be, g, g->stage_bytes * 2 * (size_t)g->pu, &st);
        return st;
    }
    g->q = grid_alloc(be, g, N * hq * D * es, &st);
    g->k = grid_alloc(be, g, N * hk * D * es, &st);
    g->v = grid_alloc(be, g, N * hk * Dv * es, &st);
    g->o = grid_alloc(be, g, N * hq * Dv * es, &st);
    g->dout = grid_alloc(be, g, N * hq * Dv * es, &st);
    g->dq = grid_alloc(be, g, N * hq * D * es, &st);
    g->dk = grid_alloc(be, g, N * hk * D * gk, &st);
    g->dv = grid_alloc(be, g, N * hk * Dv * gk, &st);
    g->lse = grid_alloc(be, g, N * hq * f, &st);
    g->dlse = grid_alloc(be, g, N * hq * f, &st);
    g->bias = grid_alloc(be, g, N * hb * f, &st);
    g->dbias = grid_alloc(be, g, N * hb * f, &st);
    if (g->pr == 1 && ra__grid_replicated(g, RA_HEADS_KV))
        g->dq_f32 = grid_alloc(be, g, N * hq * D * f, &st);
    int64_t piece = 0;
    for (int m = 0; m < g->pu; ++m)
        piece = ra__grid_rows(g, m) > piece ? ra__grid_rows(g, m) : piece;
    /* the widest row any staged tensor has, in its own type (float32: LSE, the key bias and
       the replicated kv heads' sums) */
    const size_t DD = D > Dv ? D : Dv;
    const size_t widths[] = {hq * DD * es, hk * DD * gk, hq * f, hb * f};
    size_t widest = 0;
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; ++i)
        widest = widths[i] > widest ? widths[i] : widest;
    const int sums = ra__grid_replicated(g, RA_HEADS_KV) ||
                     (hb && ra__grid_replicated(g, RA_HEADS_BIAS)); /* the accumulator slot */
    g->stage_bytes = (size_t)piece * widest;
    g->stage = grid_alloc(be, g, g->stage_bytes * (2 * (size_t)g->pu + (size_t)sums), &st);
    return st;
}

/* Who holds which of the group's tokens, and this rank's global indices (SPEC 8). */
static ringattn_status_t grid_tokens(ra_grid *g)
{
    const struct ringattn_plan *in = g->inner;
    const ra_shard *q = in->kp.queries;
    g->rows = q->rows;
    g->off = malloc(((size_t)g->pu + 1) * sizeof *g->off);
    RA_CHECK(g->off, RINGATTN_ERR_OUT_OF_MEMORY, "ringattn_plan_create: out of memory");
    for (int m = 0; m <= g->pu; ++m) g->off[m] = (int64_t)m * g->rows / g->pu;
    g->tokens = malloc((size_t)(g->rows ? g->rows : 1) * sizeof *g->tokens);
    RA_CHECK(g->tokens, RINGATTN_ERR_OUT_OF_MEMORY, "ringattn_plan_create: out of memory");
    ra__shard_global_index(q, in->cu_q, g->tokens);
    g->host_bytes = sizeof *g + ((size_t)g->pu + 1) * sizeof *g->off +
                    (size_t)g->rows * sizeof(int32_t);
    return RINGATTN_SUCCESS;
}

static void grid_free(ra_grid *g, const struct ra_backend *be)
{
    if (!g) return;
    void *mem[] = {g->q, g->k, g->v, g->o, g->dout, g->dq, g->dk, g->dv, g->lse,
                   g->dlse, g->bias, g->dbias, g->dq_f32, g->stage};
    const int previous = g->inner ? ra__device_enter(g->inner) : -1;
    /* not while the group's transport may still run over them after a failure (comm.h) */
    const int free_them = be && ra__comm_buffers_free_to_go(g->group, g->pinned,
                                                             "a 2D plan's buffers", g->bytes,
                                                             g->member, g->pu);
    for (size_t i = 0; free_them && i < sizeof mem / sizeof mem[0]; ++i)
        if (mem[i]) be->memory->free(mem[i]);
    if (g->inner) ra__device_leave(g->inner, previous);
    if (g->inner) ra__plan_destroy(g->inner);
    for (int i = 0; i < 2; ++i) ra__comm_destroy(g->owned[i]);
    free(g->off);
    free(g->tokens);
    free(g);
}

void ra__grid_destroy(struct ringattn_plan *p)
{
    grid_free(p->grid, p->be);
    free(p);
}

/* The agreement that ends a creation or a call over the grid: every rank returns the first
   failing rank's status (the group's first, then every group's through the ring comm). */
static ringattn_status_t conclude_grid(ringattn_comm_t comm, const ra_grid *g, const char *fn,
                                       ringattn_status_t st)
{
    if (comm) return ra__comm_conclude(comm, fn, st);
    st = ra__comm_conclude(g->group, fn, st);
    return ra__comm_conclude(g->ring, fn, st);
}

/* The grid's shape and the inner plan, once every rank agreed on the descriptor. */
static ringattn_status_t grid_fill(ra_grid *g, const ringattn_plan_desc_t *d,
                                   const struct ra_backend *be, const ra_plan_kinds *kinds)
{
    g->pu = g->group->size, g->pr = g->ring->size;
    g->member = g->group->rank, g->index = g->ring->rank;
    g->id[0] = g->group->calls, g->id[1] = g->ring->calls;
    g->heads[RA_HEADS_Q] = d->num_heads;
    g->heads[RA_HEADS_KV] = d->num_kv_heads ? d->num_kv_heads : d->num_heads;
    g->heads[RA_HEADS_BIAS] = d->key_bias_heads;
    g->cache = d->sharded_cache != 0;
    for (int k = 0; k < RA_HEAD_KINDS; ++k)
        g->each[k] = g->heads[k] >= g->pu ? g->heads[k] / g->pu : 1;
    const ringattn_plan_desc_t in = inner_desc(g, d);
    RA_TRY(ra__plan_create(g->pr > 1 ? g->ring : NULL, &in, kinds, &g->inner));
    RA_TRY(grid_tokens(g));
    const int previous = ra__device_enter(g->inner);
    const ringattn_status_t st = grid_buffers(be, g, d);
    ra__device_leave(g->inner, previous);
    return st;
}

ringattn_status_t ra__grid_create(const char *fn, ringattn_comm_t comm, ringattn_comm_t group,
                                  ringattn_comm_t ring, const ringattn_plan_desc_t *desc,
                                  const struct ra_plan_kinds *kinds, ringattn_plan_t *plan)
{
    /* Every rank reaches the agreements below, even with bad arguments (plan/plan.c). */
    const int pu = comm ? desc->ulysses_size : group->size;
    ringattn_plan_desc_t d = RINGATTN_PLAN_DESC_INIT;
    const struct ra_backend *be = NULL;
    ra_grid *g = calloc(1, sizeof *g);
    struct ringattn_plan *p = calloc(1, sizeof *p);
    ringattn_status_t st = RINGATTN_SUCCESS;
    if (plan == NULL)
        st = ra__fail(RINGATTN_ERR_INVALID_ARGUMENT,
                      "%s: plan: got NULL, expected a pointer to receive the plan", fn);
    else if (!g || !p)
        st = ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    else if (comm && comm->size % pu != 0)
        st = ra__fail(RINGATTN_ERR_INVALID_ARGUMENT,
                      "%s: desc.ulysses_size: got %d, expected a divisor of the comm's %d ranks",
                      fn, pu, comm->size);
    if (st == RINGATTN_SUCCESS) st = check_grid(fn, comm ? comm : group, pu, desc, &d, &be);
    if (st == RINGATTN_SUCCESS && !comm) st = check_grid(fn, ring, pu, desc, &d, &be);
    ringattn_plan_desc_t agreed = d; /* the bounds of a sharded cache: by the inner plans */
    agreed.cache_bounds = NULL;
    if (comm) { /* one comm: agree over it, then split it into groups of consecutive ranks */
        st = ra__plan_agree(comm, &agreed, be, st);
        if (st == RINGATTN_SUCCESS) {
            /* strided groups are the places of consecutive groups of P_r, and vice versa */
            st = ra__comm_split_grid(comm, fn, d.ulysses_strided ? comm->size / pu : pu, g->owned);
            st = ra__comm_conclude(comm, fn, st);
        }
        const int s = d.ulysses_strided != 0;
        group = g ? g->owned[s] : NULL, ring = g ? g->owned[!s] : NULL;
        for (int i = 0; i < 2 && st == RINGATTN_SUCCESS; ++i) g->owned[i]->refusals_elsewhere = 1;
    } else { /* the caller's two: agree over the group, then every group over the ring */
        st = ra__plan_agree(ring, &agreed, be, ra__plan_agree(group, &agreed, be, st));
    }
    if (st == RINGATTN_SUCCESS) { /* every rank agreed: what follows fails only for memory */
        g->group = group, g->ring = ring, g->parent = comm;
        g->id[2] = comm ? comm->calls : 0;
        st = grid_fill(g, &d, be, kinds);
        p->grid = g, p->be = be, p->device = g->inner ? g->inner->device : d.device;
        p->rank = comm ? comm->rank : g->index * g->pu + g->member, p->ranks = g->pu * g->pr;
        p->host_bytes = sizeof *p;
        if (st == RINGATTN_SUCCESS && ra__registry_add(p) != 0)
            st = ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
        st = conclude_grid(comm, g, fn, st);
    }
    if (st != RINGATTN_SUCCESS) {
        if (p) ra__registry_remove(p);
        grid_free(g, be);
        free(p);
        return st;
    }
    *plan = p;
    ra__log(RA_LOG_INFO, RA_SUB_PLAN, p->rank, p->ranks,
            "2D plan: %d x %d (ulysses x ring), group %d place %d, %lld of the group's %lld "
            "tokens, heads %d/%d of %d/%d", g->pu, g->pr, g->index, g->member,
            (long long)ra__grid_rows(g, g->member), (long long)g->rows, g->each[RA_HEADS_Q],
            g->each[RA_HEADS_KV], g->heads[RA_HEADS_Q], g->heads[RA_HEADS_KV]);
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

/* One tensor's bytes per call through the all-to-all: to the heads (in) or back (out). */
static void move_bytes(const ra_grid *g, size_t row_bytes, int in, size_t bytes[2])
{
    const int64_t mine = ra__grid_rows(g, g->member);
    const size_t pieces = (size_t)(g->pu - 1) * (size_t)mine * row_bytes; /* mine, to each */
    const size_t theirs = (size_t)(g->rows - mine) * row_bytes;          /* theirs, my heads */
    bytes[0] += in ? pieces : theirs;
    bytes[1] += in ? theirs : pieces;
}

void ra__grid_info(const struct ringattn_plan *p, ringattn_plan_info_t *info)
{
    const ra_grid *g = p->grid;
    const ra_kernel_params *k = &g->inner->kp;
    ra__plan_info_fill(g->inner, info);
    info->rank = p->rank;
    info->ranks = p->ranks;
    info->local_tokens = ra__grid_rows(g, g->member);
    info->buffer_bytes += g->bytes;
    info->host_bytes += g->host_bytes + p->host_bytes;
    info->memory_bytes = info->workspace_bytes + info->buffer_bytes + info->host_bytes;
    info->ulysses_size = g->pu;
    info->ring_size = g->pr;
    const size_t es = ra__dtype_size(k->dtype), f = sizeof(float);
    const size_t hq = (size_t)g->each[RA_HEADS_Q], hk = (size_t)g->each[RA_HEADS_KV];
    const size_t hb = g->heads[RA_HEADS_BIAS] ? (size_t)g->each[RA_HEADS_BIAS] : 0;
    const size_t D = (size_t)k->head_dim, Dv = (size_t)k->head_dim_v;
    const size_t gk = ra__grid_replicated(g, RA_HEADS_KV) ? f : es;
    size_t fwd[2] = {0, 0}, bwd[2] = {0, 0};
    if (g->cache) { /* every rank gets every head's O and LSE of every query (forward only) */
        info->alltoall_forward_bytes_sent = info->alltoall_forward_bytes_received =
            (size_t)(g->pu - 1) * (size_t)g->rows * hq * (Dv * es + f);
        return;
    }
    const size_t qkv = (hq * D + hk * D + hk * Dv) * es + hb * f;
    move_bytes(g, qkv, 1, fwd);
    move_bytes(g, hq * Dv * es + hq * f, 0, fwd);                      /* O, LSE */
    move_bytes(g, qkv + 2 * hq * Dv * es + hq * f, 1, bwd);            /* + O, dO, LSE */
    move_bytes(g, hq * D * es + (hk * D + hk * Dv) * gk + hb * f, 0, bwd); /* dQ, dK, dV, dBias */
    info->alltoall_forward_bytes_sent = fwd[0];
    info->alltoall_forward_bytes_received = fwd[1];
    info->alltoall_backward_bytes_sent = bwd[0];
    info->alltoall_backward_bytes_received = bwd[1];
}
