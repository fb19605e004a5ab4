// The CUDA backend's entry in the backend table (kernels/backend.h): what it refuses at plan
// creation, its workspace (the plan's kernel params mirrored to the device once, so that a
// call copies nothing but its SPEC 6 thresholds), its checks of a call's tensors, and one
// forward ring step per call (forward_tile.cu and forward_f32.cu launch the kernels).
#include "kernels/cuda/cuda_backend.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#define FN "ringattn_plan_create"

namespace {

// What the kernels cannot do (SPEC 1 shapes they have no instantiation for) is refused
// with a message: nothing falls back to the CPU.
ringattn_status_t cuda_prepare(ra_kernel_params *p)
{
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) cudaGetLastError(); // not sticky: leave no error for a later call
    RA_CHECK(e == cudaSuccess && count > 0, RINGATTN_ERR_CUDA,
             FN ": backend CUDA: no CUDA device is visible (%s)", cudaGetErrorString(e));
    if (p->device < 0) RA_CUDA_TRY(cudaGetDevice(&p->device), "cudaGetDevice");
    RA_CHECK(p->device < count, RINGATTN_ERR_INVALID_ARGUMENT,
             FN ": device: got %d, expected -1 or a device ordinal below %d", p->device, count);
    const int f32 = p->dtype == RINGATTN_FLOAT32, unit = f32 ? 4 : 8; // 16-byte chunks
    RA_CHECK(ra__cuda_dim_tile(p->head_dim) && p->head_dim % unit == 0, RINGATTN_ERR_UNSUPPORTED,
             FN ": head_dim: got %d, expected a multiple of %d up to 256 on the CUDA backend",
             p->head_dim, unit);
    RA_CHECK(ra__cuda_dim_v_tile(p->head_dim_v) && p->head_dim_v % unit == 0,
             RINGATTN_ERR_UNSUPPORTED,
             FN ": head_dim_v: got %d, expected a multiple of %d up to 256 on the CUDA backend",
             p->head_dim_v, unit);
    // the forward kernels' tiles: the float32 kernel's, or the tensor-core kernel's per D
    const int d_tile = ra__cuda_dim_tile(p->head_dim);
    const int bq = f32 ? ra_fwd32::BQ : ra__cuda_query_tile(d_tile, ra__cuda_full_features(p));
    RA_CHECK((p->block_q == 0 || p->block_q == bq) && p->block_k == 0, RINGATTN_ERR_UNSUPPORTED,
             FN ": block_q/block_k: got %d/%d, expected 0/0 (or %d/0) on the CUDA backend, "
                "whose tiles are fixed by its kernels",
             p->block_q, p->block_k, bq);
    p->block_q = bq;
    p->block_k = f32 ? ra_fwd32::BK : ra__cuda_keys_per_tile(d_tile);
    p->keys_block = ra__cuda_bwd_tile(p->head_dim, p->head_dim_v);
    return RINGATTN_SUCCESS;
}

// The host image of the workspace's one device allocation: each array at a 256-byte boundary
// (place returns its offset), copied to the device in one transfer.
struct arena_image {
    std::vector<char> bytes;
    size_t place(const void *src, size_t n)
    {
        const size_t at = (bytes.size() + 255) & ~(size_t)255;
        bytes.resize(at + n); // zeros where src is NULL
        if (src && n) std::memcpy(bytes.data() + at, src, n);
        return at;
    }
};

void cuda_workspace_destroy(struct ra_workspace *wsp)
{
    ra_cuda_ws *ws = ra__cuda_ws(wsp);
    if (!ws) return;
    if (ws->arena) cudaFree(ws->arena);
    if (ws->rows) cudaFree(ws->rows);
    if (ws->zstate) cudaFree(ws->zstate);
    if (ws->dq_slices) cudaFree(ws->dq_slices);
    std::free(ws->keys);
    std::free(ws);
}

// A tile list's place in the arena image: its items in launch order (heaviest first), its runs.
struct tiles_at {
    size_t items = 0, runs = 0;
    int count = 0;
};

tiles_at place_tiles(arena_image &img, const ra_tile_list &l)
{
    std::vector<ra_tile_item> items((size_t)l.num_items);
    for (int32_t j = 0; j < l.num_items; ++j) items[(size_t)j] = l.items[l.order[j]];
    tiles_at at;
    at.items = img.place(items.data(), items.size() * sizeof(ra_tile_item));
    at.runs = img.place(l.runs, (size_t)l.num_runs * sizeof(ra_tile_run));
    at.count = l.num_items;
    return at;
}

// The backward's own lists against key shard k: the query pass's (query-major, in the SIMT
// tiles, ra__cuda_bwd_tile; the stats pass's too) and the key pass's (key-major, in the
// tensor-core kernel's tiles where it runs), into the image.
ringattn_status_t place_backward_tiles(arena_image &img, const ra_kernel_params *p,
                                       const ra_shard *k, tiles_at *q, tiles_at *kk)
{
    const int t = p->keys_block;
    const bool tc = ra__cuda_bwd_on_tensor_cores(p); // its key tiles against its query tiles
    ra_tile_list lq, lk;
    RA_TRY(ra__tile_list_make(p->window, p->delta, p->queries, 1, t, k, t, &lq));
    ringattn_status_t st = ra__tile_list_make(p->window, p->delta, k, 0, tc ? RA_BWD_TC_KEYS : t,
                                              p->queries, tc ? RA_BWD_TC_QUERIES : t, &lk);
    if (st == RINGATTN_SUCCESS) {
        try {
            *q = place_tiles(img, lq), *kk = place_tiles(img, lk);
        } catch (...) {
            st = ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
        }
        ra__tile_list_free(&lk);
    }
    ra__tile_list_free(&lq);
    return st;
}

// One float32 copy of dQ ([H, local rows, D]) for the tensor-core backward's slices.
size_t dq_copy_bytes(const ra_kernel_params *p)
{
    return (size_t)p->num_heads * (size_t)p->queries->rows * p->head_dim * sizeof(float);
}

// The tensor-core backward's slices (backward_tc.cu), or 0 where it does not run: copies of at
// most 1 GiB in all (one at least), since FlashAttention 2's deterministic split asks for
// several times dQ's own float32 bytes at few heads.
int tc_slices(const ra_kernel_params *p, const std::vector<tiles_at> &key_lists)
{
    if (p->forward_only || !ra__cuda_bwd_on_tensor_cores(p) || p->queries->rows == 0) return 0;
    int tiles = 1, sms = 132;
    for (const tiles_at &l : key_lists) tiles = l.count > tiles ? l.count : tiles;
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, p->device) == cudaSuccess) sms = prop.multiProcessorCount;
    else cudaGetLastError(); // not sticky
    return ra__cuda_bwd_tc_slices(sms, p->num_kv_heads, tiles, dq_copy_bytes(p), (size_t)1 << 30);
}

ra_cuda_tiles device_tiles(char *base, const tiles_at &at)
{
    return ra_cuda_tiles{reinterpret_cast<const ra_tile_item *>(base + at.items),
                         reinterpret_cast<const ra_tile_run *>(base + at.runs), at.count};
}

ringattn_status_t cuda_workspace_create(const ra_kernel_params *p, struct ra_workspace **out,
                                        size_t *bytes)
{
    *out = nullptr;
    ra_cuda_ws *ws = static_cast<ra_cuda_ws *>(std::calloc(1, sizeof *ws));
    RA_CHECK(ws, RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    ws->device = p->device;
    ws->keys = static_cast<ra_cuda_keys *>(std::calloc((size_t)p->num_key_shards, sizeof *ws->keys));
    if (!ws->keys) {
        std::free(ws);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    }
    // delta, alibi, the scan's maxima, query segments, then each key shard's segments and the
    // tile lists against it (the plan's; the backward's unless the plan is forward-only)
    const size_t n = (size_t)p->num_seqs, shards = (size_t)p->num_key_shards;
    arena_image img;
    size_t o_delta = 0, o_alibi = 0, o_abs = 0, o_q = 0;
    std::vector<size_t> o_segs(shards);
    std::vector<tiles_at> o_fwd(shards), o_bq(shards), o_bk(shards);
    ringattn_status_t st = RINGATTN_SUCCESS;
    try {
        o_delta = img.place(p->delta, n * sizeof(int64_t));
        o_alibi = img.place(p->alibi, p->alibi ? (size_t)p->num_heads * sizeof(float) : 0);
        o_abs = img.place(nullptr, 4 * sizeof(float));
        o_q = img.place(p->queries->segs, (size_t)p->queries->num_segs * sizeof(ra_segment));
        for (size_t s = 0; s < shards && st == RINGATTN_SUCCESS; ++s) {
            const ra_shard *k = &p->key_shards[s];
            o_segs[s] = img.place(k->segs, (size_t)k->num_segs * sizeof(ra_segment));
            o_fwd[s] = place_tiles(img, p->key_tiles[s]);
            if (!p->forward_only) st = place_backward_tiles(img, p, k, &o_bq[s], &o_bk[s]);
        }
    } catch (...) {
        st = ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    }
    if (st != RINGATTN_SUCCESS) {
        cuda_workspace_destroy((struct ra_workspace *)ws);
        return st;
    }
    const size_t states = (size_t)p->num_heads * (size_t)p->queries->rows;
    const size_t row_bytes = 3 * states * sizeof(float);
    // a ring with D_v above one tile: (m, l) of each D_v block (forward_common.cuh: state_z)
    const int zb = p->carries_state ? ra__cuda_dim_v_blocks(p->head_dim_v) : 1;
    const size_t z_bytes = zb > 1 ? 2 * (size_t)zb * states * sizeof(float) : 0;
    st = ra__cuda_alloc(img.bytes.size(), &ws->arena);
    if (st == RINGATTN_SUCCESS) st = ra__cuda_alloc(row_bytes, reinterpret_cast<void **>(&ws->rows));
    if (st == RINGATTN_SUCCESS && z_bytes)
        st = ra__cuda_alloc(z_bytes, reinterpret_cast<void **>(&ws->zstate));
    ws->slices = tc_slices(p, o_bk);
    const size_t dq_bytes = (size_t)ws->slices * dq_copy_bytes(p);
    if (st == RINGATTN_SUCCESS && dq_bytes)
        st = ra__cuda_alloc(dq_bytes, reinterpret_cast<void **>(&ws->dq_slices));
    if (st == RINGATTN_SUCCESS) {
        const cudaError_t e = cudaMemcpy(ws->arena, img.bytes.data(), img.bytes.size(),
                                         cudaMemcpyHostToDevice);
        if (e != cudaSuccess) st = ra__cuda_fail(e, "cudaMemcpy of the plan's arrays");
    }
    if (st != RINGATTN_SUCCESS) {
        cuda_workspace_destroy((struct ra_workspace *)ws);
        return st;
    }
    char *base = static_cast<char *>(ws->arena);
    ws->bytes = img.bytes.size() + row_bytes + z_bytes + dq_bytes;
    ws->delta = reinterpret_cast<const int64_t *>(base + o_delta);
    ws->alibi = p->alibi ? reinterpret_cast<const float *>(base + o_alibi) : nullptr;
    ws->absmax = reinterpret_cast<float *>(base + o_abs);
    ws->qsegs = reinterpret_cast<const ra_segment *>(base + o_q);
    for (size_t s = 0; s < shards; ++s)
        ws->keys[s] = ra_cuda_keys{reinterpret_cast<const ra_segment *>(base + o_segs[s]),
                                   device_tiles(base, o_fwd[s]), device_tiles(base, o_bq[s]),
                                   device_tiles(base, o_bk[s])};
    *out = (struct ra_workspace *)ws;
    *bytes = ws->bytes;
    return RINGATTN_SUCCESS;
}

// Device memory of the plan's device, and for Q, K and V 16-byte chunks the kernels can load.
ringattn_status_t cuda_check_tensor(const struct ra_workspace *wsp, const char *fn,
                                    const char *name, const void *data, const ra_view *v)
{
    const ra_cuda_ws *ws = (const ra_cuda_ws *)wsp;
    cudaPointerAttributes at;
    const cudaError_t e = cudaPointerGetAttributes(&at, data);
    if (e != cudaSuccess) cudaGetLastError(); // not sticky
    RA_CHECK(e == cudaSuccess &&
                 (at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged),
             RINGATTN_ERR_CUDA, "%s: %s: got %p, expected device memory (the plan's backend is "
                                "CUDA)", fn, name, data);
    RA_CHECK(at.type == cudaMemoryTypeManaged || at.device == ws->device, RINGATTN_ERR_CUDA,
             "%s: %s: got memory of device %d, expected device %d (the plan's)", fn, name,
             at.device, ws->device);
    if (!v) return RINGATTN_SUCCESS;
    const int64_t unit = (int64_t)(16 / v->elem); // elements per 16-byte chunk
    RA_CHECK((uintptr_t)data % 16 == 0 && v->row % unit == 0 && v->head % unit == 0,
             RINGATTN_ERR_UNSUPPORTED,
             "%s: %s: got address %p, row stride %lld, head stride %lld, expected a 16-byte "
             "aligned address and strides that are multiples of %lld elements on the CUDA "
             "backend",
             fn, name, data, (long long)v->row, (long long)v->head, (long long)unit);
    return RINGATTN_SUCCESS;
}

// The logit's and the mask's part of a step's kernel arguments (both directions): the local
// queries' Q against the held shard's K, V (keys, one of the params' key shards).
ra_attn_args step_args(const ra_cuda_ws *ws, const ra_kernel_params *p, const ra_view *q,
                           const ra_view *k, const ra_view *v, const ra_shard *keys,
                           const ra_dyn_io *dyn, const float *lse)
{
    const int s = (int)(keys - p->key_shards);
    ra_attn_args a{};
    a.q = q->data, a.k = k->data, a.v = v->data;
    a.q_row = q->row, a.q_head = q->head, a.k_row = k->row, a.k_head = k->head;
    a.v_row = v->row, a.v_head = v->head;
    a.lse = const_cast<float *>(lse);
    a.qsegs = ws->qsegs, a.ksegs = ws->keys[s].segs, a.delta = ws->delta;
    a.items = ws->keys[s].fwd.items, a.runs = ws->keys[s].fwd.runs; // the backward: its own
    a.tq = (int)p->queries->rows, a.heads = p->num_heads, a.kv_heads = p->num_kv_heads;
    a.d = p->head_dim, a.dv = p->head_dim_v;
    a.window = p->window;
    a.scale = p->scale, a.softcap = p->softcap;
    a.softcap_scale = ra__logit_scale(p);
    a.alibi = ws->alibi;
    a.bias = dyn->bias, a.bias_ld = dyn->ld, a.bias_heads = p->bias_heads;
    a.thr_b = dyn->thr_b, a.thr_p = dyn->thr_p;
    a.absmax = p->dtype == RINGATTN_FLOAT16 ? nullptr : ws->absmax;
    a.bf16 = p->dtype == RINGATTN_BFLOAT16;
    a.split_p = p->high_precision;
    a.full_features = ra__cuda_full_features(p);
    return a;
}

// The backward's own arguments: the prologue's row arrays, its tiles and, against the held
// key shard (keys; NULL: the prologue), its tile lists.
ra_bwd_args backward_args(const ra_cuda_ws *ws, const ra_kernel_params *p, ra_attn_args f,
                          const ra_shard *keys)
{
    ra_bwd_args a{};
    a.f = f;
    const size_t n = (size_t)p->num_heads * (size_t)p->queries->rows;
    a.drow = ws->rows, a.pshift = ws->rows + n, a.pscale = ws->rows + 2 * n;
    a.dtype = p->dtype == RINGATTN_FLOAT32 ? 0 : p->dtype == RINGATTN_BFLOAT16 ? 1 : 2;
    a.bq = a.bk = p->keys_block;
    if (keys) {
        const ra_cuda_keys &k = ws->keys[keys - p->key_shards];
        a.f.items = k.bwd_q.items, a.f.runs = k.bwd_q.runs;
        a.kitems = k.bwd_k.items, a.kruns = k.bwd_k.runs;
    }
    return a;
}

// One forward step (params.h): the local queries against the held shard, on the call's stream;
// with stats_only the SPEC 9 recomputation of the backward ((m, l) of the tiles holding a
// lossy row: the kernels decide which, from LSE).
ringattn_status_t cuda_attend_forward(struct ra_workspace *wsp, const ra_kernel_params *p,
                                      const ra_fwd_io *io)
{
    ra_cuda_ws *ws = ra__cuda_ws(wsp);
    const ra_cuda_keys &keys = ws->keys[io->keys - p->key_shards];
    if (keys.fwd.count == 0) return RINGATTN_SUCCESS; // no local query
    ra_attn_args a = step_args(ws, p, io->q, io->k, io->v, io->keys, &io->dyn, io->lse);
    a.m = io->m, a.l = io->l, a.acc = io->acc;
    a.first = io->first, a.last = io->last;
    a.sinks = io->sinks;
    const cudaStream_t stream = ra__cuda_stream(io->stream);
    if (io->stats_only) {
        RA_CUDA_TRY((cudaError_t)ra__cuda_backward_stats(backward_args(ws, p, a, io->keys),
                                                         keys.bwd_q.count, stream),
                    "backward stats launch");
        return RINGATTN_SUCCESS;
    }
    const int zb = ra__cuda_dim_v_blocks(p->head_dim_v);
    if (zb > 1 && !(io->first && io->last)) { // each D_v block carries its own (m, l)
        RA_CHECK(ws->zstate, RINGATTN_ERR_INTERNAL, "ringattn: CUDA: D_v = %d over several steps "
                 "without per-block state", p->head_dim_v);
        a.state_z = (int64_t)p->num_heads * p->queries->rows;
        a.m = ws->zstate, a.l = ws->zstate + zb * a.state_z;
    }
    a.o = io->o->data, a.o_row = io->o->row, a.o_head = io->o->head;
    const int st = p->dtype == RINGATTN_FLOAT32 ? ra__cuda_forward_f32(a, keys.fwd.count, stream)
                                                : ra__cuda_forward_tile(a, keys.fwd.count, stream);
    RA_CUDA_TRY((cudaError_t)st, "forward kernel launch");
    return RINGATTN_SUCCESS;
}

// The backward's prologue, once per call (params.h).
ringattn_status_t cuda_backward_prologue(struct ra_workspace *wsp, const ra_kernel_params *p,
                                         const ra_bwd_prologue_io *io)
{
    ra_cuda_ws *ws = ra__cuda_ws(wsp);
    if (p->queries->rows == 0 && !io->dsinks) return RINGATTN_SUCCESS;
    ra_attn_args f{};
    f.heads = p->num_heads, f.tq = (int)p->queries->rows, f.dv = p->head_dim_v;
    f.lse = const_cast<float *>(io->lse);
    ra_bwd_args a = backward_args(ws, p, f, nullptr);
    a.dout = io->dout->data, a.do_row = io->dout->row, a.do_head = io->dout->head;
    const int st = ra__cuda_backward_prologue(a, io->o->data, io->o->row, io->o->head, *io,
                                              ra__cuda_stream(io->stream));
    RA_CUDA_TRY((cudaError_t)st, "backward prologue launch");
    return RINGATTN_SUCCESS;
}

// One backward step (params.h): the key pass (dK, dV, dBias of the held shard) and the query
// pass (dQ), on the call's stream.
ringattn_status_t cuda_attend_backward(struct ra_workspace *wsp, const ra_kernel_params *p,
                                       const ra_bwd_io *io)
{
    ra_cuda_ws *ws = ra__cuda_ws(wsp);
    const ra_cuda_keys &keys = ws->keys[io->keys - p->key_shards];
    ra_bwd_args a = backward_args(ws, p, step_args(ws, p, io->q, io->k, io->v, io->keys, &io->dyn,
                                                   io->lse), io->keys);
    a.dout = io->dout->data, a.do_row = io->dout->row, a.do_head = io->dout->head;
    a.dq = io->dq->data, a.dq_row = io->dq->row, a.dq_head = io->dq->head;
    a.dk = io->dk->data, a.dk_row = io->dk->row, a.dk_head = io->dk->head;
    a.dv = io->dv->data, a.dv_row = io->dv->row, a.dv_head = io->dv->head;
    a.dbias = io->dyn.dbias, a.accumulate = io->accumulate;
    const cudaStream_t stream = ra__cuda_stream(io->stream);
    // kv heads per key-pass block: all of them when they share one bias head (H_b < H_kv), so
    // that a block owns the dBias rows of its key tile
    const int Hk = p->num_kv_heads, gb = io->dyn.dbias && p->bias_heads < Hk ? Hk : 1;
    if (ws->slices) { // tensor cores: dK, dV, dBias and dQ in one pass (and dQ's sum)
        // no key tile: nothing to add to sums, but a stored dQ is written (zero: SPEC 7)
        if (keys.bwd_k.count == 0 && io->accumulate) return RINGATTN_SUCCESS;
        a.key_items = keys.bwd_k.count, a.slices = ws->slices, a.dq_slices = ws->dq_slices;
        RA_CUDA_TRY((cudaError_t)ra__cuda_backward_tc(a, Hk / gb, stream), "backward launch");
        return RINGATTN_SUCCESS;
    }
    if (keys.bwd_k.count > 0)
        RA_CUDA_TRY((cudaError_t)ra__cuda_backward_keys(a, keys.bwd_k.count, Hk / gb, stream),
                    "backward key pass launch");
    if (keys.bwd_q.count > 0)
        RA_CUDA_TRY((cudaError_t)ra__cuda_backward_queries(a, keys.bwd_q.count, stream),
                    "backward query pass launch");
    return RINGATTN_SUCCESS;
}

} // namespace

// The table, filled by name (C++17 has no designated initializers; CMake does not know nvcc's
// C++20 flags yet): a constant initialised when the library loads, before any call reads it.
static ra_backend cuda_table()
{
    ra_backend b{};
    b.name = "cuda";
    b.kind = RINGATTN_BACKEND_CUDA;
    b.prepare = cuda_prepare;
    b.workspace_create = cuda_workspace_create;
    b.workspace_destroy = cuda_workspace_destroy;
    b.check_tensor = cuda_check_tensor;
    b.copy = ra__cuda_copy;
    b.add_f32 = ra__cuda_add_f32;
    b.scan = ra__cuda_scan;
    b.scan_agreed = ra__cuda_scan_agreed;
    b.merge = nullptr; // ringattn_merge_partials is host memory (the CPU's)
    b.state_partial = ra__cuda_state_partial;
    b.merge_f32 = ra__cuda_merge_f32;
    b.memory = &ra__cuda_memory;
    b.attend_forward = cuda_attend_forward;
    b.backward_prologue = cuda_backward_prologue;
    b.attend_backward = cuda_attend_backward;
    return b;
}

extern "C" const struct ra_backend ra__cuda_backend = cuda_table();
