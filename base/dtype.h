/*
 * Storage dtypes of SPEC 1: float16 and bfloat16 <-> float32, round to nearest even, with
 * inf and NaN preserved. Inline and CUDA-compatible (RA_HD); no intrinsics.
 */
#ifndef RINGATTN_BASE_DTYPE_H
#define RINGATTN_BASE_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "base/host_device.h"
#include "ringattn.h"

RA_HD uint32_t ra__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

RA_HD float ra__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

RA_HD float ra__bf16_to_f32(uint16_t h) { return ra__bits_f32((uint32_t)h << 16); }

RA_HD uint16_t ra__f32_to_bf16(float f)
{
    const uint32_t u = ra__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

RA_HD float ra__f16_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return ra__bits_f32(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
    if (exp != 0) return ra__bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24 is exact in float32 */
    const float mag = (float)man * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
}

RA_HD uint16_t ra__f32_to_f16(float f)
{
    const uint32_t u = ra__f32_bits(f);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);      /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);     /* rounds to inf */
    if (a >= 0x38800000u) {                                      /* normal half */
        const uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
        return (uint16_t)(sign | (r >> 13));
    }
    /* subnormal half (or zero): value / 2^-24 rounded to nearest even by the FPU */
    const float scaled = ra__bits_f32(a) * 16777216.0f;
    uint32_t q = (uint32_t)scaled;
    const float rem = scaled - (float)q;
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return (uint16_t)(sign | q);
}

/* Bytes of one element of a storage dtype. */
RA_HD size_t ra__dtype_size(ringattn_dtype_t dt) { return dt == RINGATTN_FLOAT32 ? 4 : 2; }

/* n elements of storage dtype dt at src as float32 into dst. */
RA_HD void ra__load_f32(float *dst, const void *src, ringattn_dtype_t dt, int64_t n)
{
    const uint16_t *h = (const uint16_t *)src;
    if (dt == RINGATTN_FLOAT32) memcpy(dst, src, (size_t)n * sizeof(float));
    else if (dt == RINGATTN_FLOAT16)
        for (int64_t c = 0; c < n; ++c) dst[c] = ra__f16_to_f32(h[c]);
    else
        for (int64_t c = 0; c < n; ++c) dst[c] = ra__bf16_to_f32(h[c]);
}

/* n float32 values into storage dtype dt at dst (rounded to nearest even): every store of
   float32 results into the caller's tensors goes through here. */
RA_HD void ra__store_f32(void *dst, ringattn_dtype_t dt, const float *src, int64_t n)
{
    uint16_t *h = (uint16_t *)dst;
    if (dt == RINGATTN_FLOAT32) memcpy(dst, src, (size_t)n * sizeof(float));
    else if (dt == RINGATTN_FLOAT16)
        for (int64_t c = 0; c < n; ++c) h[c] = ra__f32_to_f16(src[c]);
    else
        for (int64_t c = 0; c < n; ++c) h[c] = ra__f32_to_bf16(src[c]);
}

#endif
