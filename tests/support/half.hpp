// float16 / bfloat16 <-> float conversions for the tests, written independently of the library's
// kernels/dtype.h so that a bug there cannot hide in both. Round to nearest, ties to even, done in
// double arithmetic (exact for every float input) with nearbyint in the default rounding mode.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace ratest {

namespace detail {
// Encode |a| (finite, non-negative, a double holding a float) with `mbits` mantissa bits and
// exponent bias `bias`, exponent field of `ebits` bits. Returns the magnitude bits.
inline uint32_t encode_mag(double a, int mbits, int bias, int ebits)
{
    const uint32_t inf_bits = ((1u << ebits) - 1u) << mbits;
    if (a == 0.0) return 0;
    const int emin = 1 - bias; // exponent of the smallest normal
    int ex = 0;
    (void)std::frexp(a, &ex); // a = f * 2^ex, f in [0.5, 1)
    int e = ex - 1;           // a = 1.m * 2^e
    if (e < emin) {
        // Subnormal: a / 2^(emin - mbits) rounded; 2^mbits rounds up into the smallest normal.
        double m = std::nearbyint(std::ldexp(a, mbits - emin));
        return (uint32_t)m;
    }
    if (e > bias) return inf_bits;
    double m = std::nearbyint((std::ldexp(a, -e) - 1.0) * (double)(1u << mbits));
    // m == 2^mbits carries into the exponent field, which is exactly what adding does; at the
    // largest exponent it produces the infinity encoding.
    uint32_t bits = ((uint32_t)(e + bias) << mbits) + (uint32_t)m;
    return bits > inf_bits ? inf_bits : bits;
}

inline double decode_mag(uint32_t bits, int mbits, int bias, int ebits)
{
    const uint32_t emask = (1u << ebits) - 1u;
    uint32_t e = (bits >> mbits) & emask;
    uint32_t m = bits & ((1u << mbits) - 1u);
    if (e == emask) return m ? NAN : INFINITY;
    if (e == 0) return std::ldexp((double)m, 1 - bias - mbits);
    return std::ldexp(1.0 + (double)m / (double)(1u << mbits), (int)e - bias);
}
} // namespace detail

inline uint16_t float_to_half_bits(float x)
{
    if (std::isnan(x)) return 0x7e00;
    uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    double a = std::fabs((double)x);
    if (std::isinf(a)) return sign | 0x7c00;
    return sign | (uint16_t)detail::encode_mag(a, 10, 15, 5);
}

inline float half_bits_to_float(uint16_t h)
{
    double v = detail::decode_mag(h & 0x7fffu, 10, 15, 5);
    return (float)((h & 0x8000u) ? -v : v);
}

inline uint16_t float_to_bf16_bits(float x)
{
    if (std::isnan(x)) return 0x7fc0;
    uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    double a = std::fabs((double)x);
    if (std::isinf(a)) return sign | 0x7f80;
    return sign | (uint16_t)detail::encode_mag(a, 7, 127, 8);
}

inline float bf16_bits_to_float(uint16_t h)
{
    double v = detail::decode_mag(h & 0x7fffu, 7, 127, 8);
    return (float)((h & 0x8000u) ? -v : v);
}

inline float round_to_half(float x) { return half_bits_to_float(float_to_half_bits(x)); }
inline float round_to_bf16(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }

} // namespace ratest
