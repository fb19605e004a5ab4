// The tests' own float16 / bfloat16 conversions (support/half.hpp), on which the oracle's inputs
// and the plain same-precision implementation rest: exhaustive round trips and round-to-nearest-
// even checked against the neighbouring representable values.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "support/half.hpp"

using namespace ratest;

namespace {

bool is_nan16(uint16_t b, bool bf) { return bf ? (b & 0x7f80) == 0x7f80 && (b & 0x7f) : (b & 0x7c00) == 0x7c00 && (b & 0x3ff); }

double val(uint16_t b, bool bf) { return bf ? bf16_bits_to_float(b) : half_bits_to_float(b); }
uint16_t enc(float x, bool bf) { return bf ? float_to_bf16_bits(x) : float_to_half_bits(x); }

// x positive finite: the encoding must be the nearest of the representable neighbours, ties to
// the even mantissa, overflowing to infinity past the largest finite value + half an ulp.
bool nearest_even(float x, bool bf)
{
    const uint16_t b = enc(x, bf);
    const uint16_t inf = bf ? 0x7f80 : 0x7c00;
    if (b > inf) return false;
    const double d = std::fabs((double)x - val(b, bf));
    if (b == inf) {
        // Overflow: x must be at least max + ulp/2 (the tie goes to the "even" infinity).
        const double mx = val(inf - 1, bf), ulp = mx - val(inf - 2, bf);
        return (double)x >= mx + ulp / 2;
    }
    // The value above the largest finite one continues the binade (2^16 for float16).
    const double up = b + 1 < inf ? val(b + 1, bf) : 2 * val(b, bf) - val(b - 1, bf);
    const double dn = std::fabs((double)x - up);
    const double dp = b > 0 ? std::fabs((double)x - val(b - 1, bf)) : INFINITY;
    if (d > dn || d > dp) return false;
    if ((d == dn || d == dp) && (b & 1)) return false; // a tie must pick the even one
    return true;
}

} // namespace

TEST_CASE("every 16-bit pattern survives decode + encode", "[half]")
{
    for (bool bf : {false, true}) {
        INFO((bf ? "bfloat16" : "float16"));
        int bad = 0;
        for (uint32_t b = 0; b < 65536; ++b) {
            const float f = (float)val((uint16_t)b, bf);
            if (is_nan16((uint16_t)b, bf)) {
                bad += !std::isnan(f) || !is_nan16(enc(f, bf), bf);
                continue;
            }
            bad += enc(f, bf) != b;
        }
        CHECK(bad == 0);
    }
}

TEST_CASE("known values", "[half]")
{
    CHECK(float_to_half_bits(1.0f) == 0x3c00);
    CHECK(float_to_half_bits(-2.0f) == 0xc000);
    CHECK(float_to_half_bits(65504.0f) == 0x7bff);
    CHECK(float_to_half_bits(65519.0f) == 0x7bff);
    CHECK(float_to_half_bits(65520.0f) == 0x7c00); // tie between 65504 and 65536 -> even (inf)
    CHECK(float_to_half_bits(1e10f) == 0x7c00);
    CHECK(float_to_half_bits(std::ldexp(1.0f, -24)) == 0x0001);
    CHECK(float_to_half_bits(std::ldexp(1.0f, -25)) == 0x0000); // tie -> even (zero)
    CHECK(float_to_half_bits(std::ldexp(3.0f, -26)) == 0x0001);
    CHECK(float_to_half_bits(std::ldexp(3.0f, -25)) == 0x0002); // 1.5 ulp -> tie -> even (2)
    CHECK(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00); // tie -> even
    CHECK(float_to_half_bits(1.0f + std::ldexp(3.0f, -11)) == 0x3c02); // tie -> even
    CHECK(float_to_half_bits(-0.0f) == 0x8000);
    CHECK(float_to_bf16_bits(1.0f) == 0x3f80);
    CHECK(float_to_bf16_bits(-1.0f) == 0xbf80);
    CHECK(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3f80); // tie -> even
    CHECK(float_to_bf16_bits(1.0f + std::ldexp(3.0f, -8)) == 0x3f82);
    CHECK(float_to_bf16_bits(3.4028235e38f) == 0x7f80); // rounds past the largest bf16
    CHECK(float_to_bf16_bits(-65536.0f) == 0xc780);
    CHECK(bf16_bits_to_float(0x7f7f) == std::ldexp(255.0f, 120));
    CHECK(half_bits_to_float(0x0001) == std::ldexp(1.0f, -24));
    CHECK(std::isinf(half_bits_to_float(0x7c00)));
    CHECK(std::isnan(half_bits_to_float(0x7e00)));
    CHECK(std::isnan(bf16_bits_to_float(0x7fc0)));
}

TEST_CASE("random floats round to the nearest, ties to even", "[half]")
{
    std::mt19937_64 rng(0x68616c66ull);
    for (bool bf : {false, true}) {
        INFO((bf ? "bfloat16" : "float16"));
        int bad = 0;
        for (int i = 0; i < 200000; ++i) {
            uint32_t u = (uint32_t)rng();
            float x;
            if (i % 4 == 0) {
                // exact midpoints between neighbours
                uint16_t b = (uint16_t)(rng() % (bf ? 0x7f7f : 0x7bff));
                x = (float)((val(b, bf) + val((uint16_t)(b + 1), bf)) / 2);
            } else {
                // random magnitude in the interesting range
                const int e = bf ? (int)(rng() % 250) - 130 : (int)(rng() % 45) - 28;
                x = std::ldexp(1.0f + (float)(u >> 8) / 16777216.0f, e);
            }
            if (!std::isfinite(x) || x < 0) continue;
            bad += !nearest_even(x, bf);
            bad += enc(-x, bf) != (uint16_t)(enc(x, bf) | 0x8000);
        }
        CHECK(bad == 0);
    }
}

// The library's own conversions (kernels/dtype.h, header-only) against the ones above.
#if __has_include("kernels/dtype.h")
#include "base/dtype.h"

namespace {

bool same_half(uint16_t a, uint16_t b, bool bf)
{
    if (is_nan16(a, bf) || is_nan16(b, bf)) return is_nan16(a, bf) && is_nan16(b, bf);
    return a == b;
}

int lib_encode_mismatches(float x)
{
    int bad = 0;
    bad += !same_half(ra__f32_to_f16(x), float_to_half_bits(x), false);
    bad += !same_half(ra__f32_to_bf16(x), float_to_bf16_bits(x), true);
    return bad;
}

} // namespace

TEST_CASE("kernels/dtype.h decodes every 16-bit pattern exactly", "[half][dtype]")
{
    int bad = 0;
    for (uint32_t b = 0; b < 65536; ++b) {
        const uint16_t h = (uint16_t)b;
        const float a = ra__f16_to_f32(h), e = half_bits_to_float(h);
        const float c = ra__bf16_to_f32(h), f = bf16_bits_to_float(h);
        bad += !(a == e || (std::isnan(a) && std::isnan(e)));
        bad += std::signbit(a) != std::signbit(e);
        bad += !(c == f || (std::isnan(c) && std::isnan(f)));
        bad += std::signbit(c) != std::signbit(f);
    }
    CHECK(bad == 0);
}

TEST_CASE("kernels/dtype.h rounds to nearest even like the tests' conversions", "[half][dtype]")
{
    int bad = 0;
    // every representable 16-bit value, its float neighbours and the exact midpoints (ties)
    for (bool bf : {false, true})
        for (uint32_t b = 0; b < 65535; ++b) {
            if (is_nan16((uint16_t)b, bf) || is_nan16((uint16_t)(b + 1), bf)) continue;
            const double v0 = val((uint16_t)b, bf), v1 = val((uint16_t)(b + 1), bf);
            if (std::isinf(v0) || std::isinf(v1) || (b & 0x7fff) == 0x7fff) continue;
            const float mid = (float)((v0 + v1) / 2);
            for (float x : {(float)v0, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                            std::nextafter(mid, -INFINITY)})
                bad += lib_encode_mismatches(x);
        }
    // a sweep over all float bit patterns with a stride, specials included
    for (uint64_t u = 0; u <= 0xffffffffull; u += 257) {
        float x;
        const uint32_t w = (uint32_t)u;
        std::memcpy(&x, &w, 4);
        bad += lib_encode_mismatches(x);
    }
    for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65519.996f, 65520.0f, 3.4028235e38f})
        bad += lib_encode_mismatches(x);
    CHECK(bad == 0);
}
#endif
