/*
 * A 2D plan (ringattn.h: ulysses_size, ringattn_plan_create_2d; DESIGN, "Ulysses inside a
 * group, the ring across groups"): P = P_u x P_r ranks. The layout splits the tokens among the
 * P_r groups as a ring of P_r ranks would; each group's tokens are split among its P_u ranks in
 * consecutive pieces. A call moves every rank's piece to head shards by an all-to-all inside
 * the group (each rank then holds the group's tokens for H / P_u query heads and their kv
 * heads), runs the inner ring plan over the ring comm (the ranks at the same place in every
 * group, one head shard), and moves the outputs back. The outer struct ringattn_plan is a shell
 * that carries the grid; the inner plan is an ordinary ring (P_r = 1: a single-rank plan).
 * Internal.
 */
#ifndef RINGATTN_PLAN_GRID_H
#define RINGATTN_PLAN_GRID_H

#include <stddef.h>
#include <stdint.h>

#include "base/call_stream.h"
#include "ringattn.h"

struct ringattn_plan;
struct ra_plan_kinds;

/* The most ranks a group may have (the all-to-all's messages sit on the stack: no call
   allocates). */
#define RA_GRID_MAX_GROUP 256

/* The head kinds a tensor is split by: query heads, kv heads, key bias heads. */
enum { RA_HEADS_Q, RA_HEADS_KV, RA_HEADS_BIAS, RA_HEAD_KINDS };

typedef struct ra_grid {
    ringattn_comm_t group, ring; /* P_u ranks of this rank's group; P_r ranks at its place */
    ringattn_comm_t owned[2];    /* the two comms, when the library split them off one comm */
    ringattn_comm_t parent;      /* that comm (else NULL): a failure of the grid's fails it too */
    int pu, pr, member, index;   /* member: rank in the group; index: the group's place */
    unsigned id[3];              /* the call numbers of the creation on group, ring, parent */
    struct ringattn_plan *inner; /* the ring over `ring` of the group's tokens, H / P_u heads */
    int heads[RA_HEAD_KINDS];    /* of the whole plan: H, H_kv, H_b (0: no bias) */
    int each[RA_HEAD_KINDS];     /* of every rank: its share, at least 1 (replicated below P_u) */
    int64_t rows;                /* the group's tokens: the inner plan's local rows */
    int64_t *off;                /* [P_u + 1]: member m holds the group's rows off[m] .. off[m+1] */
    int32_t *tokens;             /* the group's rows' global indices (ra__grid_tokens) */
    /* backend memory: the inner plan's tensors over the group's tokens (packed), the staging
       of the all-to-all, and the float32 dQ a single-rank inner backward sums into when kv
       heads are replicated */
    void *q, *k, *v, *o, *dout, *dq, *dk, *dv;
    float *lse, *dlse, *bias, *dbias, *dq_f32;
    void *stage;
    size_t stage_bytes, bytes, host_bytes;
    int pinned; /* a call failed with the group's transport maybe still over these buffers */
    /* A sharded KV cache (inference): every rank holds every query and its group's share of
       the cache for its kv heads; the inner plan is a sharded cache over the ring comm, and the
       group gathers every head's O and LSE (no sequence moves). */
    int cache;
} ra_grid;

/* The first head of kind `kind` held by member m (its each[kind] heads follow). */
static inline int ra__grid_first_head(const ra_grid *g, int kind, int m)
{
    return (int)((int64_t)m * g->each[RA_HEADS_Q] * g->heads[kind] / g->heads[RA_HEADS_Q]);
}

/* kv heads (and a bias of fewer heads than P_u) are replicated across the group: their
   gradients are summed over the members that share a head, in float32. */
static inline int ra__grid_replicated(const ra_grid *g, int kind)
{
    return g->heads[kind] < g->pu;
}

/* This rank's rows' global indices (SPEC 8): its piece of the group's (a KV cache plan's:
   every query). */
static inline const int32_t *ra__grid_tokens(const ra_grid *g)
{
    return g->tokens + (g->cache ? 0 : g->off[g->member]);
}

/* The rows of member m (a KV cache plan's: every query). */
static inline int64_t ra__grid_rows(const ra_grid *g, int m)
{
    return g->cache ? g->rows : g->off[m + 1] - g->off[m];
}

/*
 * ringattn_plan_create for desc->ulysses_size > 1 over one comm (split here into groups of
 * consecutive ranks), or ringattn_plan_create_2d over the caller's two (owned = 0). Collective.
 */
ringattn_status_t ra__grid_create(const char *fn, ringattn_comm_t comm, ringattn_comm_t group,
                                  ringattn_comm_t ring, const ringattn_plan_desc_t *desc,
                                  const struct ra_plan_kinds *kinds, ringattn_plan_t *plan);
void ra__grid_destroy(struct ringattn_plan *p);
void ra__grid_info(const struct ringattn_plan *p, ringattn_plan_info_t *info);

#endif
