/*
 * The struct_size policy (ringattn.h, abi.h). Fields are only ever added at a struct's end,
 * so a released size names a prefix of the current struct: its bytes up to the first field
 * added after that release. Trailing padding of an older struct is never read: a new field may
 * sit where the old struct had padding.
 */
#include <stddef.h>
#include <string.h>

#include "base/abi.h"
#include "base/error.h"

/* The 0.1 layouts (tests/compat/v0_1/ringattn.h), for their sizes on this ABI. */
struct ra_plan_desc_v0_1 {
    size_t struct_size;
    int num_heads, num_kv_heads, head_dim, head_dim_v;
    ringattn_dtype_t dtype;
    ringattn_layout_t layout;
    int num_seqs;
    const int32_t *cu_seqlens, *cu_seqlens_k;
    int causal, window_left, window_right;
    float softmax_scale, softcap;
    const float *alibi_slopes;
    int key_bias_heads, keep_k, block_q, block_k, num_threads;
};

/* 0.2 added backend and device to the descriptor; its tensors were 0.1's. */
struct ra_plan_desc_v0_2 {
    struct ra_plan_desc_v0_1 v0_1;
    ringattn_backend_t backend;
    int device;
};

/* 0.3 added the KV cache's fields (its layout, as 0.3's header declared it); 0.4 added
   precision. */
struct ra_plan_desc_v0_3 {
    size_t struct_size;
    int num_heads, num_kv_heads, head_dim, head_dim_v;
    ringattn_dtype_t dtype;
    ringattn_layout_t layout;
    int num_seqs;
    const int32_t *cu_seqlens, *cu_seqlens_k;
    int causal, window_left, window_right;
    float softmax_scale, softcap;
    const float *alibi_slopes;
    int key_bias_heads, keep_k, block_q, block_k, num_threads;
    ringattn_backend_t backend;
    int device;
    int sharded_cache;
    const int32_t *cache_bounds, *cu_seqlens_new;
};

/* 0.4 added precision; 0.6 ulysses_size. */
struct ra_plan_desc_v0_4 {
    struct ra_plan_desc_v0_3 v0_3;
    ringattn_precision_t precision;
};

struct ra_tensors_v0_2 {
    size_t struct_size;
    ringattn_tensor_t q, k, v, o;
    float *lse;
    ringattn_tensor_t dout, dq, dk, dv;
    const float *key_bias;
    float *dbias;
};

/* 0.3 added the new tokens' K/V (and 0.4 kept those tensors); 0.5 the sinks and dlse. */
struct ra_tensors_v0_3 {
    struct ra_tensors_v0_2 v0_2;
    ringattn_tensor_t k_new, v_new;
    const float *key_bias_new;
};

struct ra_plan_info_v0_1 {
    size_t struct_size;
    int rank, ranks;
    int64_t local_tokens;
    int num_steps, compute_steps;
    size_t forward_bytes_sent, forward_bytes_received, backward_bytes_sent,
        backward_bytes_received;
};

/* 0.2 added the backend, tiles and memory; 0.6 the 2D plan's fields. */
struct ra_plan_info_v0_2 {
    struct ra_plan_info_v0_1 v0_1;
    ringattn_backend_t backend;
    int device, block_q, block_k;
    size_t bias_bytes_received, workspace_bytes, buffer_bytes, host_bytes, memory_bytes;
};

/* A released size of a struct and the bytes of the current struct it covers. */
typedef struct release {
    size_t size, used;
} release;

static const release desc_releases[] = {
    {sizeof(struct ra_plan_desc_v0_1), offsetof(ringattn_plan_desc_t, backend)},
    {sizeof(struct ra_plan_desc_v0_2), offsetof(ringattn_plan_desc_t, sharded_cache)},
    {sizeof(struct ra_plan_desc_v0_3), offsetof(ringattn_plan_desc_t, precision)},
    {sizeof(struct ra_plan_desc_v0_4), offsetof(ringattn_plan_desc_t, ulysses_size)},
    {sizeof(ringattn_plan_desc_t), sizeof(ringattn_plan_desc_t)},
};
static const release tensors_releases[] = {
    {sizeof(struct ra_tensors_v0_2), offsetof(ringattn_tensors_t, k_new)},
    {sizeof(struct ra_tensors_v0_3), offsetof(ringattn_tensors_t, sinks)},
    {sizeof(ringattn_tensors_t), sizeof(ringattn_tensors_t)},
};
/* The caller's transport table (ringattn_transport.h): 0.3's, and 0.6's with alltoall_start. */
struct ra_transport_v0_3 {
    size_t struct_size;
    void *user;
    void (*callbacks[5])(void); /* sendrecv_start, test, wait, allreduce, release */
};
static const release transport_releases[] = {
    {sizeof(struct ra_transport_v0_3), offsetof(ringattn_transport_t, alltoall_start)},
    {sizeof(ringattn_transport_t), sizeof(ringattn_transport_t)},
};
_Static_assert(offsetof(ringattn_transport_t, alltoall_start) == sizeof(struct ra_transport_v0_3) &&
                   sizeof(struct ra_transport_v0_3) != sizeof(ringattn_transport_t),
               "0.3 transport fields are a prefix of the current table, and its size one release's");
static const release info_releases[] = {
    {sizeof(struct ra_plan_info_v0_1), offsetof(ringattn_plan_info_t, backend)},
    {sizeof(struct ra_plan_info_v0_2), offsetof(ringattn_plan_info_t, ulysses_size)},
    {sizeof(ringattn_plan_info_t), sizeof(ringattn_plan_info_t)},
};

_Static_assert(offsetof(ringattn_plan_desc_t, backend) >=
                   offsetof(struct ra_plan_desc_v0_1, num_threads) + sizeof(int),
               "0.1 descriptor fields are a prefix of the current descriptor");
_Static_assert(offsetof(ringattn_plan_info_t, backend) >=
                   offsetof(struct ra_plan_info_v0_1, backward_bytes_received) + sizeof(size_t),
               "0.1 info fields are a prefix of the current info");

_Static_assert(offsetof(ringattn_plan_desc_t, sharded_cache) >= sizeof(struct ra_plan_desc_v0_1) &&
                   offsetof(ringattn_tensors_t, k_new) >=
                       offsetof(struct ra_tensors_v0_2, dbias) + sizeof(float *),
               "0.2 descriptor and tensors fields are a prefix of the current ones");
_Static_assert(sizeof(struct ra_plan_desc_v0_2) != sizeof(ringattn_plan_desc_t) &&
                   sizeof(struct ra_plan_desc_v0_2) != sizeof(struct ra_plan_desc_v0_1) &&
                   sizeof(struct ra_tensors_v0_2) != sizeof(ringattn_tensors_t),
               "a size names one release");
_Static_assert(offsetof(ringattn_plan_desc_t, precision) ==
                       offsetof(struct ra_plan_desc_v0_3, cu_seqlens_new) + sizeof(void *) &&
                   sizeof(struct ra_plan_desc_v0_3) != sizeof(ringattn_plan_desc_t) &&
                   sizeof(struct ra_plan_desc_v0_3) != sizeof(struct ra_plan_desc_v0_2),
               "0.3 descriptor fields are a prefix of the current descriptor, and its size one "
               "release's");
_Static_assert(offsetof(ringattn_tensors_t, sinks) ==
                       offsetof(struct ra_tensors_v0_3, key_bias_new) + sizeof(void *) &&
                   sizeof(struct ra_tensors_v0_3) != sizeof(ringattn_tensors_t) &&
                   sizeof(struct ra_tensors_v0_3) != sizeof(struct ra_tensors_v0_2),
               "0.3 tensors fields are a prefix of the current tensors, and its size one release's");
_Static_assert(sizeof(struct ra_plan_desc_v0_1) != sizeof(ringattn_plan_desc_t) &&
                   sizeof(struct ra_plan_info_v0_1) != sizeof(ringattn_plan_info_t),
               "a size names one release");

_Static_assert(offsetof(ringattn_plan_desc_t, ulysses_size) ==
                       offsetof(struct ra_plan_desc_v0_4, precision) + sizeof(int) &&
                   sizeof(struct ra_plan_desc_v0_4) != sizeof(ringattn_plan_desc_t) &&
                   sizeof(struct ra_plan_desc_v0_4) != sizeof(struct ra_plan_desc_v0_3) &&
                   offsetof(ringattn_plan_info_t, ulysses_size) == sizeof(struct ra_plan_info_v0_2) &&
                   sizeof(struct ra_plan_info_v0_2) != sizeof(ringattn_plan_info_t),
               "0.4 descriptor and 0.2 info fields are prefixes of the current ones, and their "
               "sizes one release's");

/* The bytes of the current struct a caller's struct_size covers, or 0 if it is no release. */
static size_t covered(const release *r, size_t n, size_t size)
{
    for (size_t i = 0; i < n; ++i)
        if (r[i].size == size) return r[i].used;
    return 0;
}

#define COVERED(list, size) covered(list, sizeof list / sizeof list[0], size)

/* The caller's struct src (struct_size its first field) as this version's in dst (size
   bytes): the defaults, then the bytes src's release has. */
static ringattn_status_t struct_in(const char *fn, const char *what, const char *init,
                                   const release *r, size_t n, const void *src, void *dst,
                                   const void *defaults, size_t size)
{
    const size_t given = *(const size_t *)src;
    const size_t used = covered(r, n, given);
    RA_CHECK(used > 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: %s->struct_size: got %zu, expected %zu (this version)%s (use %s)", fn, what,
             given, size, n > 1 ? " or an older release's size" : "", init);
    memcpy(dst, defaults, size);
    memcpy(dst, src, used);
    *(size_t *)dst = size;
    return RINGATTN_SUCCESS;
}

#define STRUCT_IN(type, what, init, list, src, dst)                                           \
    do {                                                                                      \
        const type defaults_ = init;                                                          \
        return struct_in(fn, what, #init, list, sizeof list / sizeof list[0], src, dst,       \
                         &defaults_, sizeof defaults_);                                       \
    } while (0)

ringattn_status_t ra__desc_in(const char *fn, const ringattn_plan_desc_t *d,
                              ringattn_plan_desc_t *out)
{
    STRUCT_IN(ringattn_plan_desc_t, "desc", RINGATTN_PLAN_DESC_INIT, desc_releases, d, out);
}

ringattn_status_t ra__tensors_in(const char *fn, const ringattn_tensors_t *t,
                                 ringattn_tensors_t *out)
{
    STRUCT_IN(ringattn_tensors_t, "tensors", RINGATTN_TENSORS_INIT, tensors_releases, t, out);
}

ringattn_status_t ra__transport_in(const char *fn, const ringattn_transport_t *t,
                                   ringattn_transport_t *out)
{
    STRUCT_IN(ringattn_transport_t, "transport", RINGATTN_TRANSPORT_INIT, transport_releases, t, out);
}

ringattn_status_t ra__info_check(const char *fn, const ringattn_plan_info_t *info)
{
    RA_CHECK(info != NULL, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: info: got NULL, expected a ringattn_plan_info_t from RINGATTN_PLAN_INFO_INIT",
             fn);
    RA_CHECK(COVERED(info_releases, info->struct_size) > 0, RINGATTN_ERR_INVALID_ARGUMENT,
             "%s: info->struct_size: got %zu, expected %zu (use RINGATTN_PLAN_INFO_INIT)", fn,
             info->struct_size, sizeof *info);
    return RINGATTN_SUCCESS;
}

void ra__info_out(const ringattn_plan_info_t *full, ringattn_plan_info_t *info)
{
    const size_t size = info->struct_size;
    memcpy(info, full, COVERED(info_releases, size));
    info->struct_size = size;
}
