/* ringattn_plan_create / _destroy: descriptor validation and the registry of live plans. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "ring/plan/agree.h"
#include "base/error.h"
#include "base/log.h"
#include "ring/plan/plan.h"
#include "base/registry.h"
#include "ring/ring.h"
#include "ring/plan/schedule.h"
#include "ring/plan/select.h"

#define FN "ringattn_plan_create"

int ra__plan_is_live(const struct ringattn_plan *plan) { return ra__registry_contains(plan); }

static ringattn_status_t check_cu_seqlens(const char *name, const int32_t *cu, int n)
{
    RA_CHECK(cu != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": %s: got NULL, expected an array of num_seqs + 1 = %d entries", name, n + 1);
    RA_CHECK(cu[0] == 0, RINGATTN_ERR_INVALID_ARGUMENT, FN ": %s[0]: got %d, expected 0", name,
             (int)cu[0]);
    for (int s = 0; s < n; ++s)
        RA_CHECK(cu[s + 1] >= cu[s], RINGATTN_ERR_INVALID_ARGUMENT,
                 FN ": %s: got %s[%d] = %d < %s[%d] = %d, expected non-decreasing", name, name,
                 s + 1, (int)cu[s + 1], name, s, (int)cu[s]);
    return RINGATTN_SUCCESS;
}

static ringattn_status_t check_shapes(const ringattn_plan_desc_t *d)
{
    RA_CHECK(d->num_heads > 0, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": num_heads: got %d, expected > 0", d->num_heads);
    RA_CHECK(d->num_kv_heads >= 0, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": num_kv_heads: got %d, expected >= 0 (0 = num_heads)", d->num_kv_heads);
    const int hkv = d->num_kv_heads ? d->num_kv_heads : d->num_heads;
    RA_CHECK(d->num_heads % hkv == 0, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": num_kv_heads: got %d, expected a divisor of num_heads = %d", hkv, d->num_heads);
    RA_CHECK(d->head_dim > 0, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": head_dim: got %d, expected > 0", d->head_dim);
    RA_CHECK(d->head_dim <= RA_MAX_HEAD_DIM, RINGATTN_ERR_UNSUPPORTED,
             FN ": head_dim: got %d, expected <= %d", d->head_dim, RA_MAX_HEAD_DIM);
    RA_CHECK(d->head_dim_v >= 0, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": head_dim_v: got %d, expected >= 0 (0 = head_dim)", d->head_dim_v);
    RA_CHECK(d->head_dim_v <= RA_MAX_HEAD_DIM, RINGATTN_ERR_UNSUPPORTED,
             FN ": head_dim_v: got %d, expected <= %d", d->head_dim_v, RA_MAX_HEAD_DIM);
    RA_CHECK(d->dtype == RINGATTN_FLOAT32 || d->dtype == RINGATTN_FLOAT16 ||
                 d->dtype == RINGATTN_BFLOAT16,
             RINGATTN_ERR_INVALID_ARGUMENT, FN ": dtype: got %d, expected a ringattn_dtype_t",
             (int)d->dtype);
    RA_CHECK(d->layout == RINGATTN_LAYOUT_CONTIGUOUS || d->layout == RINGATTN_LAYOUT_ZIGZAG ||
                 d->layout == RINGATTN_LAYOUT_STRIPED,
             RINGATTN_ERR_INVALID_ARGUMENT, FN ": layout: got %d, expected a ringattn_layout_t",
             (int)d->layout);
    RA_CHECK(d->num_seqs >= 0, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": num_seqs: got %d, expected >= 0", d->num_seqs);
    RA_TRY(check_cu_seqlens("cu_seqlens", d->cu_seqlens, d->num_seqs));
    if (d->cu_seqlens_k) RA_TRY(check_cu_seqlens("cu_seqlens_k", d->cu_seqlens_k, d->num_seqs));
    return RINGATTN_SUCCESS;
}

static ringattn_status_t check_masks(const ringattn_plan_desc_t *d)
{
    RA_CHECK(d->window_left >= -1, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": window_left: got %d, expected >= -1 (-1 = unbounded)", d->window_left);
    RA_CHECK(d->window_right >= -1, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": window_right: got %d, expected >= -1 (-1 = unbounded)", d->window_right);
    RA_CHECK(isfinite(d->softmax_scale) && d->softmax_scale >= 0.0f, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": softmax_scale: got %g, expected finite and >= 0 (0 = 1/sqrt(head_dim))",
             (double)d->softmax_scale);
    RA_CHECK(isfinite(d->softcap) && d->softcap >= 0.0f, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": softcap: got %g, expected finite and >= 0 (0 = off)", (double)d->softcap);
    if (d->alibi_slopes)
        for (int h = 0; h < d->num_heads; ++h)
            RA_CHECK(isfinite(d->alibi_slopes[h]), RINGATTN_ERR_INVALID_ARGUMENT,
                     FN ": alibi_slopes[%d]: got %g, expected finite", h,
                     (double)d->alibi_slopes[h]);
    const int hb = d->key_bias_heads, hkv = d->num_kv_heads ? d->num_kv_heads : d->num_heads;
    RA_CHECK(hb == 0 || hb == 1 || hb == hkv || hb == d->num_heads, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": key_bias_heads: got %d, expected 0 (no bias), 1, num_kv_heads = %d or "
                "num_heads = %d",
             hb, hkv, d->num_heads);
    RA_CHECK(d->keep_k >= 0, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": keep_k: got %d, expected >= 0 (0 = no selection)", d->keep_k);
    RA_CHECK(d->keep_k == 0 || hb > 0, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": keep_k: got %d with key_bias_heads = 0, expected a key bias to select by",
             d->keep_k);
    return RINGATTN_SUCCESS;
}

static ringattn_status_t check_tuning(const ringattn_plan_desc_t *d)
{
    RA_CHECK(d->block_q >= 0 && d->block_q <= 1024, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": block_q: got %d, expected 0..1024 (0 = default)", d->block_q);
    RA_CHECK(d->block_k >= 0 && d->block_k <= 1024, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": block_k: got %d, expected 0..1024 (0 = default)", d->block_k);
    RA_CHECK(d->num_threads >= 0 && d->num_threads <= 1024, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": num_threads: got %d, expected 0..1024 (0 = OpenMP default)", d->num_threads);
    return RINGATTN_SUCCESS;
}

static int32_t *copy_i32(const int32_t *src, int n)
{
    int32_t *dst = malloc((size_t)n * sizeof *dst);
    if (dst) memcpy(dst, src, (size_t)n * sizeof *dst);
    return dst;
}

static void plan_free(struct ringattn_plan *p)
{
    if (p->ws && p->kops && p->kops->workspace_free) p->kops->workspace_free(p->ws);
    ra__ring_free(p->ring);
    ra__select_free(p->select);
    for (int r = 0; p->shards && r < p->ranks; ++r) ra__shard_free(&p->shards[r]);
    free(p->shards);
    free(p->step_compute);
    free(p->last_hop);
    ra__shard_free(&p->q_shard);
    ra__shard_free(&p->k_shard);
    free(p->delta);
    free(p->cu_q);
    free(p->cu_k);
    free(p->alibi);
    free(p);
}

/*
 * The local queries and keys as shards: one segment per sequence on one rank (keys from
 * cu_seqlens_k); in a ring every rank's tokens under the layout, local Q and K the same tokens.
 */
static ringattn_status_t plan_shards(struct ringattn_plan *p)
{
    if (!p->comm) {
        p->ranks = 1;
        RA_TRY(ra__shard_make(RINGATTN_LAYOUT_CONTIGUOUS, 1, 0, p->cu_q, p->num_seqs, &p->q_shard));
        return ra__shard_make(RINGATTN_LAYOUT_CONTIGUOUS, 1, 0, p->cu_k, p->num_seqs, &p->k_shard);
    }
    p->rank = p->comm->rank;
    p->ranks = p->comm->size;
    p->shards = calloc((size_t)p->ranks, sizeof *p->shards);
    RA_CHECK(p->shards, RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    for (int r = 0; r < p->ranks; ++r)
        RA_TRY(ra__shard_make(p->layout, p->ranks, r, p->cu_q, p->num_seqs, &p->shards[r]));
    RA_TRY(ra__shard_make(p->layout, p->ranks, p->rank, p->cu_q, p->num_seqs, &p->q_shard));
    RA_TRY(ra__shard_make(p->layout, p->ranks, p->rank, p->cu_q, p->num_seqs, &p->k_shard));
    p->total_q = p->total_k = p->q_shard.rows; /* local rows */
    return RINGATTN_SUCCESS;
}

/* Derived values of the validated descriptor d (SPEC 2-3 defaults). */
static ringattn_status_t plan_fill(struct ringattn_plan *p, ringattn_comm_t comm,
                                   const ringattn_plan_desc_t *d)
{
    p->desc = *d;
    p->comm = comm;
    p->layout = d->layout;
    p->desc.cu_seqlens = p->desc.cu_seqlens_k = NULL;
    p->desc.alibi_slopes = NULL;
    p->num_heads = d->num_heads;
    p->num_kv_heads = d->num_kv_heads ? d->num_kv_heads : d->num_heads;
    p->head_dim = d->head_dim;
    p->head_dim_v = d->head_dim_v ? d->head_dim_v : d->head_dim;
    p->dtype = d->dtype;
    p->num_seqs = d->num_seqs;
    p->cu_q = copy_i32(d->cu_seqlens, d->num_seqs + 1);
    p->cu_k = copy_i32(d->cu_seqlens_k ? d->cu_seqlens_k : d->cu_seqlens, d->num_seqs + 1);
    if (d->alibi_slopes) {
        p->alibi = malloc((size_t)d->num_heads * sizeof *p->alibi);
        if (p->alibi) memcpy(p->alibi, d->alibi_slopes, (size_t)d->num_heads * sizeof *p->alibi);
    }
    RA_CHECK(p->cu_q && p->cu_k && (p->alibi || !d->alibi_slopes), RINGATTN_ERR_OUT_OF_MEMORY,
             FN ": out of memory copying the descriptor");
    p->total_q = p->cu_q[p->num_seqs];
    p->total_k = p->cu_k[p->num_seqs];
    p->delta = malloc(((size_t)p->num_seqs + 1) * sizeof *p->delta);
    RA_CHECK(p->delta, RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    for (int s = 0; s < p->num_seqs; ++s)
        p->delta[s] = (int64_t)(p->cu_k[s + 1] - p->cu_k[s]) - (p->cu_q[s + 1] - p->cu_q[s]);
    RA_TRY(plan_shards(p));
    p->window.left = d->window_left;
    p->window.right = d->causal ? 0 : d->window_right;
    p->scale = d->softmax_scale > 0.0f ? d->softmax_scale : 1.0f / sqrtf((float)d->head_dim);
    p->softcap = d->softcap;
    p->bias_heads = d->key_bias_heads;
    p->keep_k = d->keep_k;
    /* SPEC 6: a row with at most keep_k valid keys keeps them all, so keep_k >= every sequence's
       length is no selection at all, and is computed as such (bitwise as keep_k = 0). */
    for (int s = 0; s < p->num_seqs; ++s)
        if (p->cu_k[s + 1] - p->cu_k[s] > p->longest_k) p->longest_k = p->cu_k[s + 1] - p->cu_k[s];
    p->selects = p->keep_k > 0 && p->keep_k < p->longest_k;
    p->block_q = d->block_q;
    p->block_k = d->block_k;
    p->num_threads = d->num_threads;
    p->kops = &ra__cpu_kernel_ops;
    RA_TRY(p->kops->supports(p));
    return ra__schedule_make(p);
}

static void log_plan(const struct ringattn_plan *p)
{
    if (!ra__log_enabled(RA_LOG_INFO)) return;
    static const char *dtypes[] = {"float32", "float16", "bfloat16"};
    static const char *layouts[] = {"contiguous", "zigzag", "striped"};
    ra__log(RA_LOG_INFO, p->rank, p->ranks, "ringattn %s, backend %s, %d rank(s), layout %s",
            ringattn_version_string(), p->kops->name, p->ranks, layouts[p->layout]);
    ra__log(RA_LOG_INFO, p->rank, p->ranks,
            "plan: %d seqs, %lld queries, %lld keys, heads %d/%d, dims %d/%d, %s, window "
            "(%lld, %lld), scale %g, softcap %g, alibi %s",
            p->num_seqs, (long long)p->total_q, (long long)p->total_k, p->num_heads,
            p->num_kv_heads, p->head_dim, p->head_dim_v, dtypes[p->dtype],
            (long long)p->window.left, (long long)p->window.right, (double)p->scale,
            (double)p->softcap, p->alibi ? "on" : "off");
}

/* Everything a rank can check alone about its descriptor. */
static ringattn_status_t check_desc(ringattn_comm_t comm, const ringattn_plan_desc_t *desc)
{
    RA_CHECK(desc != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": desc: got NULL, expected a descriptor from RINGATTN_PLAN_DESC_INIT");
    RA_CHECK(desc->struct_size == sizeof(ringattn_plan_desc_t), RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": desc->struct_size: got %zu, expected %zu (use RINGATTN_PLAN_DESC_INIT)",
             desc->struct_size, sizeof(ringattn_plan_desc_t));
    RA_TRY(check_shapes(desc));
    RA_TRY(check_masks(desc));
    RA_TRY(check_tuning(desc));
    if (comm && desc->cu_seqlens_k)
        for (int s = 0; s <= desc->num_seqs; ++s)
            RA_CHECK(desc->cu_seqlens_k[s] == desc->cu_seqlens[s], RINGATTN_ERR_INVALID_ARGUMENT,
                     FN ": cu_seqlens_k[%d]: got %d, expected %d (in a ring queries and keys are "
                        "the same tokens; use NULL)",
                     s, (int)desc->cu_seqlens_k[s], (int)desc->cu_seqlens[s]);
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_plan_create(ringattn_comm_t comm, const ringattn_plan_desc_t *desc,
                                       ringattn_plan_t *plan)
{
    RA_CHECK(comm == NULL || ra__registry_contains(comm), RINGATTN_ERR_INVALID_USAGE,
             FN ": comm: got %p, expected NULL or a live communicator", (void *)comm);
    /* In a ring every rank reaches the agreement below, even with bad arguments: a rank that
       returned early would leave the others waiting. */
    ringattn_status_t st = plan != NULL ? check_desc(comm, desc)
                                        : ra__fail(RINGATTN_ERR_INVALID_ARGUMENT,
                                                   FN ": plan: got NULL, expected a pointer to "
                                                      "receive the plan");
    if (comm) st = ra__plan_agree(comm, desc, st);
    RA_TRY(st);

    struct ringattn_plan *p = calloc(1, sizeof *p);
    RA_CHECK(p != NULL, RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    st = plan_fill(p, comm, desc);
    if (st == RINGATTN_SUCCESS && ra__registry_add(p) != 0)
        st = ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    if (st != RINGATTN_SUCCESS) {
        plan_free(p);
        return st;
    }
    *plan = p;
    log_plan(p);
    ra__clear_error();
    return RINGATTN_SUCCESS;
}

ringattn_status_t ringattn_plan_destroy(ringattn_plan_t plan)
{
    if (plan == NULL) return RINGATTN_SUCCESS;
    RA_CHECK(ra__registry_remove(plan), RINGATTN_ERR_INVALID_USAGE,
             "ringattn_plan_destroy: plan: got %p, expected a live plan (destroyed twice?)",
             (void *)plan);
    plan_free(plan);
    return RINGATTN_SUCCESS;
}
