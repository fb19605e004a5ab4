// The wrapper header (DESIGN: CUDA: the backend): every tensor-core and async-copy instruction,
// dynamic shared memory and the kernel launch, for both builds of one kernel source. Under nvcc:
// inline PTX (sm_80+). Under g++: the SIMT emulation (emu/cuda_emu.h), where each is a warp
// collective or a deferred copy. This file, the emulation and nothing else may test __CUDACC__ or
// __CUDA_ARCH__ (a test greps for it).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// Loops over register fragments must unroll fully, or their arrays go to local memory; a loop
// kept rolled (RA_NO_UNROLL) holds one iteration's values at a time, where registers are short.
#define RA_UNROLL _Pragma("unroll")
#define RA_NO_UNROLL _Pragma("unroll 1")

// Two floats as a 16-bit pair (bf16 or f16, round to nearest even), the lower index low.
__device__ __forceinline__ uint32_t ra_pack_16x2(bool bf16, float lo, float hi)
{
    if (bf16) {
        const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t *>(&v);
    }
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&v);
}

// A 16-bit pair (ra_pack_16x2's) as two floats: one conversion instruction each (f16's C
// conversion in base/dtype.h is branches and registers that the P V loop cannot spare).
__device__ __forceinline__ void ra_unpack_16x2(bool bf16, uint32_t v, float &lo, float &hi)
{
    if (bf16) {
        lo = __uint_as_float(v << 16), hi = __uint_as_float(v & 0xffff0000u);
        return;
    }
    const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&v));
    lo = f.x, hi = f.y;
}

// One 16-bit value (bf16 or f16) as a float: one conversion instruction, as ra_unpack_16x2.
__device__ __forceinline__ float ra_unpack_16(bool bf16, uint16_t h)
{
    return bf16 ? __uint_as_float((uint32_t)h << 16) : __half2float(__ushort_as_half(h));
}

// x, hidden from the compiler's loop-invariant code motion: addresses derived from it are
// computed where they are used (an instruction each) instead of hoisted out of the loop (a
// register each for the whole loop, which a kernel at 255 registers spills).
__device__ __forceinline__ int ra_opaque(int x)
{
    asm volatile("" : "+r"(x));
    return x;
}

// Shared memory as the kernels address it: a plain pointer here (the emulation's counts its
// accesses), and dynamic shared memory as `ra_smem<type> name`, 16-byte aligned.
template <class T> using ra_smem = T *;
#define RA_DYNAMIC_SMEM(type, name)                                   \
    extern __shared__ __align__(16) unsigned char ra_dynamic_smem_[]; \
    type *name = reinterpret_cast<type *>(ra_dynamic_smem_)

// A shared-memory pointer's address (the emulation's counted pointer's), as functions that take
// a T * want it.
template <class T> __device__ __forceinline__ T *ra_raw(T *p) { return p; }

// A global load or store of `bytes` at p, for the emulation's counters; nothing here.
__device__ __forceinline__ void ra_count_global_load(const void *, unsigned) {}
__device__ __forceinline__ void ra_count_global_store(const void *, unsigned) {}
// A float32 fused multiply-add (FFMA), which the emulation counts.
__device__ __forceinline__ float ra_fma(float a, float b, float c) { return fmaf(a, b, c); }

// 2^x in one MUFU.EX2 (about 2 ulp; subnormal results flushed to 0, -inf gives 0): the
// softmax's exponential, its scale folded into the argument's FFMA (FlashAttention 2).
__device__ __forceinline__ float ra_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 1 / x in one MUFU.RCP (about 1 ulp): no call to the precise division's slow path, which in a
// kernel holding its accumulators in registers costs spills around the call.
__device__ __forceinline__ float ra_rcp(float x)
{
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// a * b rounded on its own: never contracted with a following add into an FFMA, where a
// value must equal its rounding elsewhere (nvcc contracts a * b + c by default)
__device__ __forceinline__ float ra_mul_rn(float a, float b) { return __fmul_rn(a, b); }

// 16 bytes, for vector loads and stores (LDS.128, STG.128).
using ra_u32x4 = uint4;
using ra_f32x4 = float4;
using ra_f32x2 = float2;

// D = C + A B: A 16x16 row-major, B 16x8 column-major (bf16 or f16), C and D float32, in the
// PTX ISA's fragments (lane l, g = l >> 2, t = l & 3).
__device__ __forceinline__ void ra_mma_16816(bool bf16, float d[4], const uint32_t a[4],
                                             const uint32_t b[2], const float c[4])
{
    if (bf16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                       "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                       "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// Four 8x8 matrices of 16-bit elements from shared memory: lane l gives the 16-byte row
// l & 7 of matrix l >> 3; r[i] is this lane's part of matrix i (.trans: transposed).
__device__ __forceinline__ void ra_ldmatrix_x4(bool trans, uint32_t r[4], const void *row)
{
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// 16 bytes global -> shared, asynchronous; zeros when pred is false.
__device__ __forceinline__ void ra_cp_async16(void *smem, const void *gmem, bool pred)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem),
                 "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void ra_cp_async_commit() { asm volatile("cp.async.commit_group;"); }
// Waits until at most `keep` committed groups are in flight.
template <int keep> __device__ __forceinline__ void ra_cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(keep));
}

// Launches kernel; st = 0 (cudaSuccess) or the launch's error (RA_SMEM_OPTIN below).
#define RA_LAUNCH(st, kernel, grid, block, smem, stream, ...)                                  \
    do {                                                                                       \
        st = RA_SMEM_OPTIN(kernel, smem);                                                      \
        if (st == 0) {                                                                         \
            kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__);                        \
            st = (int)cudaGetLastError();                                                      \
        }                                                                                      \
    } while (0)

// What the runtime can add to a failed call's message (nothing here: cudaGetErrorString says it).
inline const char *ra_device_error_detail() { return ""; }

#else // the SIMT emulation
#include "emu/counted.h"
#include "emu/cuda_emu.h"
#include "base/dtype.h"

#define RA_UNROLL
#define RA_NO_UNROLL

// The emulation's report of a failed launch (the sites of a deadlock or divergence).
inline const char *ra_device_error_detail() { return ::ra_emu::last_error(); }

inline uint32_t ra_pack_16x2(bool bf16, float lo, float hi)
{
    const uint16_t a = bf16 ? ra__f32_to_bf16(lo) : ra__f32_to_f16(lo);
    const uint16_t b = bf16 ? ra__f32_to_bf16(hi) : ra__f32_to_f16(hi);
    return (uint32_t)a | ((uint32_t)b << 16);
}

inline float ra_unpack_16(bool bf16, uint16_t h) { return bf16 ? ra__bf16_to_f32(h) : ra__f16_to_f32(h); }

inline void ra_unpack_16x2(bool bf16, uint32_t v, float &lo, float &hi)
{
    lo = ra_unpack_16(bf16, (uint16_t)(v & 0xffffu)), hi = ra_unpack_16(bf16, (uint16_t)(v >> 16));
}
inline int ra_opaque(int x) { return x; }

template <class T> using ra_smem = ::ra_emu::SharedPtr<T>;
#define RA_DYNAMIC_SMEM(type, name) \
    ra_smem<type> name(reinterpret_cast<type *>(::ra_emu::dynamic_smem()))

inline void ra_count_global_load(const void *p, unsigned bytes, RA_EMU_SITE_PARAMS)
{
    ra_emu::count_access(ra_emu::Kind::ld_global, p, bytes, RA_EMU_SITE_ARG);
}
inline void ra_count_global_store(const void *p, unsigned bytes, RA_EMU_SITE_PARAMS)
{
    ra_emu::count_access(ra_emu::Kind::st_global, p, bytes, RA_EMU_SITE_ARG);
}
inline float ra_fma(float a, float b, float c)
{
    ra_emu::count_ffma();
    return std::fma(a, b, c);
}

// 2^x and 1 / x (the GPU's ex2.approx and rcp.approx within their 2 and 1 ulp: compare the
// two builds by tolerance, never bitwise)
inline float ra_exp2(float x) { return std::exp2(x); }
inline float ra_rcp(float x) { return 1.0f / x; }
inline float ra_mul_rn(float a, float b) { return a * b; } // g++ -std=c++17 does not contract

struct alignas(16) ra_u32x4 {
    uint32_t x, y, z, w;
};
struct alignas(16) ra_f32x4 {
    float x, y, z, w;
};
struct alignas(8) ra_f32x2 {
    float x, y;
};

inline void ra_mma_16816(bool bf16, float d[4], const uint32_t a[4], const uint32_t b[2],
                         const float c[4], RA_EMU_SITE_PARAMS)
{
    uint32_t in[10];
    std::memcpy(in, a, 16);
    std::memcpy(in + 4, b, 8);
    std::memcpy(in + 6, c, 16);
    uint32_t out[4];
    ra_emu::warp_collective(bf16 ? ra_emu::Collective::mma_bf16 : ra_emu::Collective::mma_f16,
                            0xffffffffu, in, 10, out, 4, RA_EMU_SITE_ARG);
    std::memcpy(d, out, 16);
}

inline void ra_ldmatrix_x4(bool trans, uint32_t r[4], const void *row,
                           RA_EMU_SITE_PARAMS);
template <class T>
inline void ra_ldmatrix_x4(bool trans, uint32_t r[4], ra_smem<T> row, RA_EMU_SITE_PARAMS)
{
    ra_ldmatrix_x4(trans, r, static_cast<const void *>(row.get()), ra_file_, ra_line_);
}
inline void ra_ldmatrix_x4(bool trans, uint32_t r[4], const void *row, const char *ra_file_,
                           int ra_line_)
{
    uint32_t in[2];
    const uintptr_t a = (uintptr_t)row;
    std::memcpy(in, &a, sizeof a);
    ra_emu::warp_collective(trans ? ra_emu::Collective::ldmatrix_x4_trans
                                  : ra_emu::Collective::ldmatrix_x4,
                            0xffffffffu, in, 2, r, 4, RA_EMU_SITE_ARG);
}

inline void ra_cp_async16(void *smem, const void *gmem, bool pred, RA_EMU_SITE_PARAMS)
{
    ra_emu::cp_async16(smem, gmem, pred, RA_EMU_SITE_ARG);
}
template <class T>
inline void ra_cp_async16(ra_smem<T> smem, const void *gmem, bool pred, RA_EMU_SITE_PARAMS)
{
    ra_emu::cp_async16(smem.get(), gmem, pred, RA_EMU_SITE_ARG);
}
inline void ra_cp_async_commit() { ra_emu::cp_async_commit(); }
template <int keep> inline void ra_cp_async_wait() { ra_emu::cp_async_wait(keep); }

// Enqueued on the fake runtime's stream, arguments copied once (as CUDA copies a launch's
// parameters); st = 0 or the configuration's error.
#define RA_LAUNCH(st, kernel, grid, block, smem, stream, ...)                                  \
    do {                                                                                       \
        st = RA_SMEM_OPTIN(kernel, smem);                                                      \
        if (st == 0)                                                                           \
            st = (int)::ra_emu::launch_kernel(::ra_emu::kernel_name<kernel>(), (stream),       \
                                              (grid), (block), (smem), kernel, __VA_ARGS__);   \
    } while (0)
#endif

// Above 48 KiB of dynamic shared memory a kernel needs an opt-in before its launch (as
// FlashAttention's launchers do at each launch): 0 or the runtime's error.
#define RA_SMEM_OPTIN(kernel, smem)                                                             \
    ((smem) > 48 * 1024 ? (int)cudaFuncSetAttribute(                                           \
                              kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)(smem)) \
                        : 0)

// A shared-memory tile seen as elements of type V (16-byte vectors for LDS.128 / STS.128, 32-bit
// words; the tile and the offsets taken aligned to V).
template <class V, class T> __device__ __forceinline__ ra_smem<V> ra_smem_as(ra_smem<T> x)
{
    return ra_smem<V>(reinterpret_cast<V *>(ra_raw(x)));
}
