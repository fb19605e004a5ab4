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

constexpr int QUERY_TILE = 64; // rows of the forward kernels' query tile (both kernels)

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
    RA_CHECK((p->block_q == 0 || p->block_q == QUERY_TILE) && p->block_k == 0,
             RINGATTN_ERR_UNSUPPORTED,
             FN ": block_q/block_k: got %d/%d, expected 0/0 (or %d/0) on the CUDA backend, "
                "whose tiles are fixed by its kernels",
             p->block_q, p->block_k, QUERY_TILE);
    p->block_q = QUERY_TILE;
    p->block_k = f32 ? 16
                     : ra__cuda_keys_per_tile(ra__cuda_dim_tile(p->head_dim),
                                              ra__cuda_dim_v_tile(p->head_dim_v));
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
    std::free(ws->keys);
    std::free(ws);
}

// The tiles of a shard's segments: (segment, first index) pairs of `rows` rows each.
std::vector<int32_t> shard_tiles(const ra_shard *sh, int rows)
{
    std::vector<int32_t> work;
    for (int i = 0; i < sh->num_segs; ++i)
        for (int64_t t0 = 0; t0 < sh->segs[i].span.count; t0 += rows)
            work.push_back(i), work.push_back((int32_t)t0);
    return work;
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
    // delta, alibi, the scan's maxima, query segments, work, then each key shard's arrays
    const size_t n = (size_t)p->num_seqs, shards = (size_t)p->num_key_shards;
    arena_image img;
    size_t o_delta = 0, o_alibi = 0, o_abs = 0, o_q = 0, o_work = 0, o_qfirst = 0;
    std::vector<size_t> o_segs(shards), o_first(shards), o_kwork(shards);
    try {
        const std::vector<int32_t> work = shard_tiles(p->queries, QUERY_TILE);
        ws->tiles = (int)(work.size() / 2);
        o_delta = img.place(p->delta, n * sizeof(int64_t));
        o_alibi = img.place(p->alibi, p->alibi ? (size_t)p->num_heads * sizeof(float) : 0);
        o_abs = img.place(nullptr, 4 * sizeof(float));
        o_q = img.place(p->queries->segs, (size_t)p->queries->num_segs * sizeof(ra_segment));
        o_work = img.place(work.data(), work.size() * sizeof(int32_t));
        o_qfirst = img.place(p->queries->seq_first, (n + 1) * sizeof(int32_t));
        for (size_t s = 0; s < shards; ++s) {
            const ra_shard *k = &p->key_shards[s];
            o_segs[s] = img.place(k->segs, (size_t)k->num_segs * sizeof(ra_segment));
            o_first[s] = img.place(k->seq_first, (n + 1) * sizeof(int32_t));
            const std::vector<int32_t> kwork = shard_tiles(k, p->keys_block);
            o_kwork[s] = img.place(kwork.data(), kwork.size() * sizeof(int32_t));
            ws->keys[s].tiles = (int)(kwork.size() / 2);
        }
    } catch (...) {
        cuda_workspace_destroy((struct ra_workspace *)ws);
        return ra__fail(RINGATTN_ERR_OUT_OF_MEMORY, FN ": out of memory");
    }
    const size_t states = (size_t)p->num_heads * (size_t)p->queries->rows;
    const size_t row_bytes = 3 * states * sizeof(float);
    // a ring with D_v above one tile: (m, l) of each D_v block (forward_common.cuh: state_z)
    const int zb = p->carries_state ? ra__cuda_dim_v_blocks(p->head_dim_v) : 1;
    const size_t z_bytes = zb > 1 ? 2 * (size_t)zb * states * sizeof(float) : 0;
    ringattn_status_t st = ra__cuda_alloc(img.bytes.size(), &ws->arena);
    if (st == RINGATTN_SUCCESS) st = ra__cuda_alloc(row_bytes, reinterpret_cast<void **>(&ws->rows));
    if (st == RINGATTN_SUCCESS && z_bytes)
        st = ra__cuda_alloc(z_bytes, reinterpret_cast<void **>(&ws->zstate));
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
    ws->bytes = img.bytes.size() + row_bytes + z_bytes;
    ws->qseq_first = reinterpret_cast<const int32_t *>(base + o_qfirst);
    ws->delta = reinterpret_cast<const int64_t *>(base + o_delta);
    ws->alibi = p->alibi ? reinterpret_cast<const float *>(base + o_alibi) : nullptr;
    ws->absmax = reinterpret_cast<float *>(base + o_abs);
    ws->qsegs = reinterpret_cast<const ra_segment *>(base + o_q);
    ws->work = reinterpret_cast<const int32_t *>(base + o_work);
    for (size_t s = 0; s < shards; ++s)
        ws->keys[s] = ra_cuda_keys{reinterpret_cast<const ra_segment *>(base + o_segs[s]),
                                   reinterpret_cast<const int32_t *>(base + o_first[s]),
                                   reinterpret_cast<const int32_t *>(base + o_kwork[s]),
                                   ws->keys[s].tiles};
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
    a.qsegs = ws->qsegs, a.work = ws->work;
    a.ksegs = ws->keys[s].segs, a.kseq_first = ws->keys[s].seq_first, a.delta = ws->delta;
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
    return a;
}

// The backward's own arguments: the prologue's row arrays, the query segments by sequence.
ra_bwd_args backward_args(const ra_cuda_ws *ws, const ra_kernel_params *p, ra_attn_args f)
{
    ra_bwd_args a{};
    a.f = f;
    const size_t n = (size_t)p->num_heads * (size_t)p->queries->rows;
    a.drow = ws->rows, a.pshift = ws->rows + n, a.pscale = ws->rows + 2 * n;
    a.dtype = p->dtype == RINGATTN_FLOAT32 ? 0 : p->dtype == RINGATTN_BFLOAT16 ? 1 : 2;
    a.qseq_first = ws->qseq_first;
    a.bq = a.bk = p->keys_block;
    return a;
}

// One forward step (params.h): the local queries against the held shard, on the call's stream;
// with stats_only the SPEC 9 recomputation of the backward ((m, l) of the tiles holding a
// lossy row: the kernels decide which, from LSE).
ringattn_status_t cuda_attend_forward(struct ra_workspace *wsp, const ra_kernel_params *p,
                                      const ra_fwd_io *io)
{
    ra_cuda_ws *ws = ra__cuda_ws(wsp);
    if (ws->tiles == 0) return RINGATTN_SUCCESS; // no local query
    ra_attn_args a = step_args(ws, p, io->q, io->k, io->v, io->keys, &io->dyn, io->lse);
    a.m = io->m, a.l = io->l, a.acc = io->acc;
    a.first = io->first, a.last = io->last;
    const cudaStream_t stream = ra__cuda_stream(io->stream);
    if (io->stats_only) {
        RA_CUDA_TRY((cudaError_t)ra__cuda_backward_stats(backward_args(ws, p, a), ws->tiles, stream),
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
    const int st = p->dtype == RINGATTN_FLOAT32 ? ra__cuda_forward_f32(a, ws->tiles, stream)
                                                : ra__cuda_forward_tile(a, ws->tiles, stream);
    RA_CUDA_TRY((cudaError_t)st, "forward kernel launch");
    return RINGATTN_SUCCESS;
}

// The backward's prologue, once per call (params.h).
ringattn_status_t cuda_backward_prologue(struct ra_workspace *wsp, const ra_kernel_params *p,
                                         const ra_bwd_prologue_io *io)
{
    ra_cuda_ws *ws = ra__cuda_ws(wsp);
    if (p->queries->rows == 0) return RINGATTN_SUCCESS;
    ra_attn_args f{};
    f.heads = p->num_heads, f.tq = (int)p->queries->rows, f.dv = p->head_dim_v;
    f.lse = const_cast<float *>(io->lse);
    ra_bwd_args a = backward_args(ws, p, f);
    a.dout = io->dout->data, a.do_row = io->dout->row, a.do_head = io->dout->head;
    const int st = ra__cuda_backward_prologue(a, io->o->data, io->o->row, io->o->head, io->row_m,
                                              io->row_l, ra__cuda_stream(io->stream));
    RA_CUDA_TRY((cudaError_t)st, "backward prologue launch");
    return RINGATTN_SUCCESS;
}

// One backward step (params.h): the key pass (dK, dV, dBias of the held shard) and the query
// pass (dQ), on the call's stream.
ringattn_status_t cuda_attend_backward(struct ra_workspace *wsp, const ra_kernel_params *p,
                                       const ra_bwd_io *io)
{
    ra_cuda_ws *ws = ra__cuda_ws(wsp);
    const int s = (int)(io->keys - p->key_shards);
    ra_bwd_args a = backward_args(ws, p, step_args(ws, p, io->q, io->k, io->v, io->keys, &io->dyn,
                                                   io->lse));
    a.dout = io->dout->data, a.do_row = io->dout->row, a.do_head = io->dout->head;
    a.dq = io->dq->data, a.dq_row = io->dq->row, a.dq_head = io->dq->head;
    a.dk = io->dk->data, a.dk_row = io->dk->row, a.dk_head = io->dk->head;
    a.dv = io->dv->data, a.dv_row = io->dv->row, a.dv_head = io->dv->head;
    a.dbias = io->dyn.dbias, a.accumulate = io->accumulate;
    a.kwork = ws->keys[s].work;
    const cudaStream_t stream = ra__cuda_stream(io->stream);
    // kv heads per key-pass block: all of them when they share one bias head (H_b < H_kv), so
    // that a block owns the dBias rows of its key tile
    const int Hk = p->num_kv_heads, gb = io->dyn.dbias && p->bias_heads < Hk ? Hk : 1;
    if (ws->keys[s].tiles > 0)
        RA_CUDA_TRY((cudaError_t)ra__cuda_backward_keys(a, ws->keys[s].tiles, Hk / gb, stream),
                    "backward key pass launch");
    if (ws->tiles > 0)
        RA_CUDA_TRY((cudaError_t)ra__cuda_backward_queries(a, ws->tiles, stream),
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
