/* Everything one rank can check about its descriptor (SPEC 1-3, 6), and its backend. */
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "base/abi.h"
#include "base/error.h"
#include "comm/comm.h"
#include "kernels/backends.h"
#include "plan/check.h"

#define FN "ringattn_plan_create"

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
    /* num_seqs + 1 boundaries are counted (and indexed) in int everywhere: it must fit. */
    RA_CHECK(d->num_seqs >= 0 && d->num_seqs < INT32_MAX, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": num_seqs: got %d, expected 0..%d (num_seqs + 1 cu_seqlens entries must fit "
                "int32)",
             d->num_seqs, INT32_MAX - 1);
    RA_TRY(check_cu_seqlens("cu_seqlens", d->cu_seqlens, d->num_seqs));
    if (d->cu_seqlens_k) RA_TRY(check_cu_seqlens("cu_seqlens_k", d->cu_seqlens_k, d->num_seqs));
    if (d->cu_seqlens_new)
        RA_TRY(check_cu_seqlens("cu_seqlens_new", d->cu_seqlens_new, d->num_seqs));
    return RINGATTN_SUCCESS;
}

/* Keys of sequence s: the cache's (cu_seqlens_k, or the queries') and the new tokens'. */
static int64_t key_length(const ringattn_plan_desc_t *d, int s)
{
    const int32_t *ck = d->cu_seqlens_k ? d->cu_seqlens_k : d->cu_seqlens;
    const int64_t cached = (int64_t)ck[s + 1] - ck[s];
    return cached + (d->cu_seqlens_new ? (int64_t)d->cu_seqlens_new[s + 1] - d->cu_seqlens_new[s]
                                       : 0);
}

/* The longest |p_i + delta - p_j| of SPEC 2 over any pair of one sequence: max(L_q, L_k) - 1. */
static int64_t longest_distance(const ringattn_plan_desc_t *d)
{
    const int32_t *cq = d->cu_seqlens;
    int64_t far = 0;
    for (int s = 0; s < d->num_seqs; ++s) {
        const int64_t lq = (int64_t)cq[s + 1] - cq[s], lk = key_length(d, s);
        const int64_t l = lq > lk ? lq : lk;
        far = l - 1 > far ? l - 1 : far;
    }
    return far;
}

/*
 * SPEC 2 and 9: the logit s = z - slope |p_i + delta - p_j| + bias, z = scale q.k (capped by a
 * softcap). The descriptor's own terms must never make s overflow or NaN (SPEC 9 promises
 * finite outputs for finite logits; an infinite or NaN logit here came out as O = 0 with
 * success). Each term may take at most half the float32 range, so that z, the ALiBi term and
 * the call's bias still sum to a number:
 * - softcap: 0 (off) or a normal float: the kernels compute z * (1 / softcap), and the
 *   reciprocal overflows below 2^-128 (then 0 * inf = NaN); z is then within +-softcap.
 * - softmax_scale: 0 (1/sqrt(D)) or at most FLT_MAX / (2 D): the logit of inputs of magnitude
 *   at most 1 (|z| <= D scale) stays within half the range. Larger logits depend on the call's
 *   |q| and |k| (SPEC 9 applies the scale before the product where that product overflows);
 *   SPEC 10 case 4's 1e30 at D = 16 is inside.
 * - alibi_slopes: finite, |slope| * (the longest distance) <= FLT_MAX / 2.
 */
static ringattn_status_t check_logit_terms(const ringattn_plan_desc_t *d)
{
    const double half = FLT_MAX / 2.0;
    const double max_scale = half / d->head_dim;
    RA_CHECK(d->softmax_scale >= 0.0f && d->softmax_scale <= max_scale,
             RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": softmax_scale: got %g, expected 0 (1/sqrt(head_dim)) or a value up to "
                "FLT_MAX / (2 head_dim) = %g (a logit of inputs of magnitude <= 1 stays finite)",
             (double)d->softmax_scale, max_scale);
    RA_CHECK(d->softcap == 0.0f || (d->softcap >= FLT_MIN && d->softcap <= FLT_MAX),
             RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": softcap: got %g, expected 0 (off) or a normal float in [FLT_MIN = %g, "
                "FLT_MAX] (the kernels divide by it)",
             (double)d->softcap, (double)FLT_MIN);
    if (!d->alibi_slopes) return RINGATTN_SUCCESS;
    const int64_t far = longest_distance(d);
    for (int h = 0; h < d->num_heads; ++h) {
        const double slope = d->alibi_slopes[h];
        RA_CHECK(isfinite(slope) && fabs(slope) * (double)far <= half,
                 RINGATTN_ERR_INVALID_ARGUMENT,
                 FN ": alibi_slopes[%d]: got %g, expected finite with |slope| * %lld (the "
                    "longest query-key distance) <= FLT_MAX / 2 = %g",
                 h, slope, (long long)far, half);
    }
    return RINGATTN_SUCCESS;
}

static ringattn_status_t check_masks(const ringattn_plan_desc_t *d)
{
    RA_CHECK(d->window_left >= -1, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": window_left: got %d, expected >= -1 (-1 = unbounded)", d->window_left);
    RA_CHECK(d->window_right >= -1, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": window_right: got %d, expected >= -1 (-1 = unbounded)", d->window_right);
    RA_TRY(check_logit_terms(d));
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
    RA_CHECK(d->precision == RINGATTN_PRECISION_DEFAULT || d->precision == RINGATTN_PRECISION_HIGH,
             RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": precision: got %d, expected RINGATTN_PRECISION_DEFAULT (0) or _HIGH (1)",
             (int)d->precision);
    return RINGATTN_SUCCESS;
}

/* The backend the descriptor asks for, if this build has it: never a silent fallback. */
static ringattn_status_t check_backend(const ringattn_plan_desc_t *d,
                                       const struct ra_backend **backend)
{
    RA_CHECK(d->backend == RINGATTN_BACKEND_AUTO || d->backend == RINGATTN_BACKEND_CPU ||
                 d->backend == RINGATTN_BACKEND_CUDA,
             RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": backend: got %d, expected RINGATTN_BACKEND_AUTO, _CPU or _CUDA",
             (int)d->backend);
    RA_CHECK(d->device >= -1, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": device: got %d, expected -1 (the current device) or a device ordinal",
             d->device);
    if (d->backend == RINGATTN_BACKEND_CUDA) {
        *backend = ra__backend_find(RINGATTN_BACKEND_CUDA); /* its prepare checks the device */
        RA_CHECK(*backend != NULL, RINGATTN_ERR_UNSUPPORTED,
                 FN ": backend: got RINGATTN_BACKEND_CUDA, but this build has no CUDA backend "
                    "(%s)", ra__backend_needs(RINGATTN_BACKEND_CUDA));
        return RINGATTN_SUCCESS;
    }
    /* AUTO is the CPU: a plan is made before any tensor is seen, and nothing tells a device
       pointer from a host one reliably in every program (DESIGN: the plan) */
    RA_CHECK(d->device <= 0, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": device: got %d, expected -1 or 0 for the CPU backend", d->device);
    *backend = ra__backend_find(RINGATTN_BACKEND_CPU);
    return RINGATTN_SUCCESS;
}

/* A ring's transport moves the memory the backend keeps its tensors in: host memory for the
   CPU backend, the plan's device's for a device backend (a device comm on that device). */
static ringattn_status_t check_transport(ringattn_comm_t comm, const ringattn_plan_desc_t *d,
                                         const struct ra_backend *be)
{
    if (!comm || comm->size == 1 || comm->simulated) return RINGATTN_SUCCESS; /* nothing moves */
    const int device_backend = ra__memory_on_device(be->memory);
    RA_CHECK(device_backend == comm->on_device, RINGATTN_ERR_UNSUPPORTED,
             FN ": comm: the %s transport moves %s memory, but the %s backend's tensors are %s "
                "memory (%s)",
             comm->ops->name, comm->on_device ? "device" : "host", be->name,
             device_backend ? "device" : "host",
             device_backend ? "a ring of CUDA plans needs ringattn_comm_create_threads_device"
                            : "use ringattn_comm_create_threads or an MPI comm");
    if (!device_backend) return RINGATTN_SUCCESS;
    const int device = d->device >= 0 ? d->device : be->memory->set_device(-1);
    RA_CHECK(device == comm->device, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": device: got %d, expected %d, the device of the comm's copies", device,
             comm->device);
    return RINGATTN_SUCCESS;
}

/*
 * Inference against a KV cache (ringattn.h: sharded_cache, cache_bounds, cu_seqlens_new). In a
 * ring the queries and keys are one set of tokens; a sharded cache splits only the keys.
 */
static ringattn_status_t check_cache(ringattn_comm_t comm, const ringattn_plan_desc_t *d)
{
    const int ranks = comm ? comm->size : 1;
    if (comm && !d->sharded_cache) {
        RA_CHECK(!d->cu_seqlens_new, RINGATTN_ERR_INVALID_ARGUMENT,
                 FN ": cu_seqlens_new: got an array in a ring, expected NULL (new K/V are "
                    "attended by a single-rank or a sharded_cache plan)");
        for (int s = 0; d->cu_seqlens_k && s <= d->num_seqs; ++s)
            RA_CHECK(d->cu_seqlens_k[s] == d->cu_seqlens[s], RINGATTN_ERR_INVALID_ARGUMENT,
                     FN ": cu_seqlens_k[%d]: got %d, expected %d (in a ring queries and keys "
                        "are the same tokens; use NULL, or sharded_cache for a KV cache split "
                        "across the ranks)",
                     s, (int)d->cu_seqlens_k[s], (int)d->cu_seqlens[s]);
    }
    if (!d->cache_bounds) return RINGATTN_SUCCESS;
    RA_CHECK(d->sharded_cache, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": cache_bounds: got an array with sharded_cache = 0, expected NULL");
    const int32_t *ck = d->cu_seqlens_k ? d->cu_seqlens_k : d->cu_seqlens;
    for (int s = 0; s < d->num_seqs; ++s) {
        const int32_t *b = d->cache_bounds + (int64_t)s * (ranks + 1);
        RA_CHECK(b[0] == 0 && b[ranks] == ck[s + 1] - ck[s], RINGATTN_ERR_INVALID_ARGUMENT,
                 FN ": cache_bounds of sequence %d: got %d .. %d, expected 0 .. %d (its cached "
                    "keys; %d ranks + 1 entries per sequence)",
                 s, (int)b[0], (int)b[ranks], (int)(ck[s + 1] - ck[s]), ranks);
        for (int r = 0; r < ranks; ++r)
            RA_CHECK(b[r + 1] >= b[r], RINGATTN_ERR_INVALID_ARGUMENT,
                     FN ": cache_bounds of sequence %d: got %d for rank %d after %d, expected "
                        "non-decreasing",
                     s, (int)b[r + 1], r + 1, (int)b[r]);
    }
    return RINGATTN_SUCCESS;
}

/* Everything a rank can check alone about its descriptor. */
ringattn_status_t ra__desc_check(ringattn_comm_t comm, const ringattn_plan_desc_t *caller,
                                 ringattn_plan_desc_t *desc, const struct ra_backend **backend)
{
    RA_CHECK(caller != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": desc: got NULL, expected a descriptor from RINGATTN_PLAN_DESC_INIT");
    RA_TRY(ra__desc_in(FN, caller, desc));
    RA_TRY(check_shapes(desc));
    RA_TRY(check_masks(desc));
    RA_TRY(check_tuning(desc));
    RA_TRY(check_backend(desc, backend));
    RA_TRY(check_transport(comm, desc, *backend));
    /* a 2D plan (plan/grid.c) checks its own split of the ranks and heads */
    RA_CHECK(desc->ulysses_size >= 0 && (desc->ulysses_size <= 1 || comm != NULL),
             RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": desc.ulysses_size: got %d, expected 0 or 1 (a flat ring), or the size of a "
                "group of the comm's ranks (not without a comm)", desc->ulysses_size);
    return check_cache(comm, desc);
}

