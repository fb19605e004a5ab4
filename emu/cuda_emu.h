// The SIMT emulation of CUDA (DESIGN: CUDA: the SIMT emulation): what kernel source sees when it
// is compiled by g++ instead of nvcc. Threads of a block are cooperative fibers (fiber.h)
// scheduled by a policy; __syncthreads is a block barrier, warp intrinsics are rendezvous of the
// lanes in their mask, computed by the lane that completes them; dynamic shared memory is poisoned
// (0xff, NaN in every float type) before each block. Deadlocks and divergence are reported by the
// launch, never a hang or an abort. Kernels reach tensor cores and async copies through
// kernels/cuda/device.cuh, never through this header directly.
#pragma once

#ifdef __CUDACC__
#error "emu/cuda_emu.h emulates CUDA on the CPU: nvcc builds use the CUDA headers"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <utility>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __restrict__ __restrict
// one instance per worker, that is per running block, shared by its fibers
#define __shared__ static thread_local

struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
constexpr int warpSize = 32;

namespace ra_emu {

// Where a thread waits: the call site of the barrier or collective (default arguments).
struct Site {
    const char *file;
    int line;
};
// As the last parameters of an intrinsic: the caller's file and line (GCC evaluates these
// builtins at the call site only when they are a default argument themselves).
#define RA_EMU_SITE_PARAMS const char *ra_file_ = __builtin_FILE(), int ra_line_ = __builtin_LINE()
#define RA_EMU_SITE_ARG ::ra_emu::Site{ra_file_, ra_line_}

enum class Collective {
    shfl_idx, shfl_up, shfl_down, shfl_xor, vote_any, vote_all, ballot, syncwarp,
    mma_bf16, mma_f16, ldmatrix_x4, ldmatrix_x4_trans
};

void barrier(Site s);
// Deposits in[nin] (<= 10 words) for this lane; returns once every lane of mask has arrived,
// with this lane's result in out[nout] (<= 8 words).
void warp_collective(Collective op, unsigned mask, const uint32_t *in, int nin, uint32_t *out,
                     int nout, Site s);

unsigned char *dynamic_smem();
size_t dynamic_smem_bytes();

// The performance counters (counters.h): the kinds of memory request, and one lane's part of
// one, counted only while counting is on (a plain flag, set between launches).
enum class Kind : uint8_t { ld_shared, st_shared, ld_global, st_global, cp_async, ldmatrix, ldmatrix_trans };
extern bool counting_on;
// The SIMT kernels make hundreds of millions of accesses, a few instructions each: an access
// that continues its lane's current run at its site (the same stride) is counted inline, with
// no call (the run's count in the site's log, counters.cpp); any other goes to
// count_access_slow, which starts a run and points the lane's slot here at it.
struct LaneRun {
    uint64_t key = 0;   // lane_run_key: the site's line, kind and width
    const char *file = nullptr;
    uint32_t count = 0; // the run's accesses so far (written back to *owner when it ends)
    uintptr_t next = 0; // the address that continues the run (0: none, a flush ended it)
    intptr_t stride = 0;
    uint32_t *owner = nullptr;
};
struct LaneLog {
    uint64_t live = 0; // which runs[] are valid
    uint64_t ffma = 0;
    LaneRun runs[64];
};
inline unsigned lane_run_slot(Kind k, Site s) { return ((unsigned)s.line ^ (unsigned)k << 4) % 64; }
inline uint64_t lane_run_key(Kind k, unsigned bytes, Site s)
{
    return (uint64_t)(uint32_t)s.line | (uint64_t)k << 32 | (uint64_t)bytes << 40;
}
// The running lane's log while counting, else null. Initial-exec: one instruction to read (the
// emulated library is tiny in static TLS; the kernels' __shared__ arrays are not). Not under
// AddressSanitizer: GCC's null check of an extern thread_local tests flags that the linker's
// relaxation of the initial-exec access to local-exec does not set, a false report.
#ifdef __SANITIZE_ADDRESS__
#define RA_EMU_FAST_TLS
#else
#define RA_EMU_FAST_TLS __attribute__((tls_model("initial-exec")))
#endif
extern thread_local LaneLog *lane_log RA_EMU_FAST_TLS;
void count_access_slow(LaneLog &lane, Kind k, const void *p, unsigned bytes, Site s);
inline void count_access(Kind k, const void *p, unsigned bytes, Site s)
{
    if (__builtin_expect(!counting_on, 1)) return; // a plain flag: off costs a test
    LaneLog *lane = lane_log;
    if (!lane) return;
    LaneRun &r = lane->runs[lane_run_slot(k, s)];
    if (__builtin_expect(r.next == (uintptr_t)p && r.key == lane_run_key(k, bytes, s) &&
                             r.file == s.file, 1)) {
        ++r.count;
        r.next += (uintptr_t)r.stride;
        return;
    }
    count_access_slow(*lane, k, p, bytes, s);
}
inline void count_ffma()
{
    if (counting_on)
        if (LaneLog *lane = lane_log) ++lane->ffma;
}

// Deferred cp.async (16 bytes): the source bytes are read now (zeros when pred is false) and
// land in dst at the wait that covers their group.
void cp_async16(void *dst, const void *src, bool pred, Site s);
void cp_async_commit();
void cp_async_wait(int keep); // all committed groups but the `keep` most recent land

// Which runnable thread runs next. A race-free kernel gives the same bits under every policy.
enum class Policy { round_robin, lowest_first, highest_first, random };
void set_policy(Policy p, uint64_t seed = 0); // for later launches from this thread
Policy policy();
// Runs body() as every thread of every block (kernel: its name, for the counters). 0, or -1
// with last_error() saying what failed (a deadlock, divergence, a misaligned ldmatrix, a
// shared-memory request above the limit...).
int launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()> &body,
           const char *kernel = "kernel");
const char *last_error();
constexpr size_t max_dynamic_smem = 227 * 1024; // an H100/H200 block's opt-in limit

// The device the fake runtime reports (RA_EMU_DEVICE: "a100", else an H200), read once.
struct DeviceModel {
    const char *name;
    int major, minor, sms;
    size_t global_bytes, l2_bytes, smem_per_sm, smem_optin;
};
const DeviceModel &device_model();

} // namespace ra_emu

#include "emu/fake_runtime.h"

namespace ra_emu {

// A kernel launch on a stream of the fake runtime: its arguments evaluated and copied once, as
// CUDA copies parameters; it runs when a synchronisation drains the stream.
template <class... Params, class... Args>
cudaError_t launch_kernel(const char *name, cudaStream_t s, dim3 grid, dim3 block, size_t smem,
                          void (*kernel)(Params...), Args &&...args)
{
    std::tuple<Params...> params(std::forward<Args>(args)...);
    if (!smem_allowed(reinterpret_cast<const void *>(kernel), smem))
        return cudaErrorInvalidValue; // above 48 KiB without cudaFuncSetAttribute
    return enqueue_launch(s, grid, block, smem,
                          [kernel, params] { std::apply(kernel, params); }, name);
}

// A kernel's name with its template arguments ("ra_fwd_tile_kernel<128, 128>"), from the
// compiler's name of this function instantiated for it.
inline std::string kernel_name_of(const std::string &pretty) // "... [with auto Kernel = k]"
{
    const std::string key = "Kernel = ";
    const size_t at = pretty.find(key), end = pretty.rfind(']');
    return at == std::string::npos || end < at ? pretty : pretty.substr(at + key.size(), end - at - key.size());
}
template <auto Kernel> const char *kernel_name()
{
    static const std::string name = kernel_name_of(__PRETTY_FUNCTION__);
    return name.c_str();
}

} // namespace ra_emu

inline void __syncthreads(RA_EMU_SITE_PARAMS) { ra_emu::barrier(RA_EMU_SITE_ARG); }
inline void __syncwarp(unsigned mask = 0xffffffffu, RA_EMU_SITE_PARAMS)
{
    ra_emu::warp_collective(ra_emu::Collective::syncwarp, mask, nullptr, 0, nullptr, 0, RA_EMU_SITE_ARG);
}

namespace ra_emu {
template <class T>
T shuffle(Collective op, unsigned mask, T v, int arg, int width, Site s)
{
    static_assert(sizeof(T) <= 8, "a shuffled value fits 8 bytes");
    uint32_t in[4] = {0, 0, (uint32_t)arg, (uint32_t)width}, out[2];
    std::memcpy(in, &v, sizeof v);
    warp_collective(op, mask, in, 4, out, 2, s);
    T r;
    std::memcpy(&r, out, sizeof r);
    return r;
}
inline uint32_t vote(Collective op, unsigned mask, int pred, Site s)
{
    const uint32_t in[1] = {pred != 0};
    uint32_t out[1];
    warp_collective(op, mask, in, 1, out, 1, s);
    return out[0];
}
} // namespace ra_emu

template <class T>
T __shfl_sync(unsigned mask, T v, int src, int width = warpSize, RA_EMU_SITE_PARAMS)
{
    return ra_emu::shuffle(ra_emu::Collective::shfl_idx, mask, v, src, width, RA_EMU_SITE_ARG);
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = warpSize, RA_EMU_SITE_PARAMS)
{
    return ra_emu::shuffle(ra_emu::Collective::shfl_up, mask, v, (int)d, width, RA_EMU_SITE_ARG);
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = warpSize,
                   RA_EMU_SITE_PARAMS)
{
    return ra_emu::shuffle(ra_emu::Collective::shfl_down, mask, v, (int)d, width, RA_EMU_SITE_ARG);
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int m, int width = warpSize, RA_EMU_SITE_PARAMS)
{
    return ra_emu::shuffle(ra_emu::Collective::shfl_xor, mask, v, m, width, RA_EMU_SITE_ARG);
}
inline int __any_sync(unsigned mask, int p, RA_EMU_SITE_PARAMS)
{
    return (int)ra_emu::vote(ra_emu::Collective::vote_any, mask, p, RA_EMU_SITE_ARG);
}
inline int __all_sync(unsigned mask, int p, RA_EMU_SITE_PARAMS)
{
    return (int)ra_emu::vote(ra_emu::Collective::vote_all, mask, p, RA_EMU_SITE_ARG);
}
inline unsigned __ballot_sync(unsigned mask, int p, RA_EMU_SITE_PARAMS)
{
    return ra_emu::vote(ra_emu::Collective::ballot, mask, p, RA_EMU_SITE_ARG);
}

// Atomics: blocks run on several workers at once, so these are real atomics.
inline int atomicAdd(int *a, int v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicAdd(unsigned *a, unsigned v) { return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); }
inline float atomicAdd(float *a, float v)
{
    float old, want;
    __atomic_load(a, &old, __ATOMIC_SEQ_CST);
    do {
        want = old + v;
    } while (!__atomic_compare_exchange(a, &old, &want, false, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST));
    return old;
}
inline int atomicMax(int *a, int v)
{
    int old = __atomic_load_n(a, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(a, &old, v, false, __ATOMIC_SEQ_CST,
                                                    __ATOMIC_SEQ_CST)) {}
    return old;
}
inline unsigned atomicMax(unsigned *a, unsigned v)
{
    unsigned old = __atomic_load_n(a, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(a, &old, v, false, __ATOMIC_SEQ_CST,
                                                    __ATOMIC_SEQ_CST)) {}
    return old;
}
inline unsigned __float_as_uint(float f)
{
    unsigned u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}
inline float __uint_as_float(unsigned u)
{
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
// __syncthreads_or: a barrier that returns whether any thread's predicate was non-zero.
inline int __syncthreads_or(int pred, RA_EMU_SITE_PARAMS)
{
    static thread_local int any; // shared by the block's fibers, as __shared__ is
    ra_emu::barrier(RA_EMU_SITE_ARG);
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) any = 0;
    ra_emu::barrier(RA_EMU_SITE_ARG);
    if (pred) any = 1;
    ra_emu::barrier(RA_EMU_SITE_ARG);
    const int r = any;
    ra_emu::barrier(RA_EMU_SITE_ARG);
    return r;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

// The fast-math intrinsics, at the CPU's full precision (the GPU's rounding differs: compare
// emulation and GPU by tolerance, never bitwise).
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
