// The CPU backend's exp (ra__exp, kernels/cpu/cpu.h) is defined for every float: NaN gives NaN
// (SPEC 9: a NaN propagates), -inf and anything below -87.3 give exactly 0 (SPEC 4: a masked
// logit's p is 0), anything at or above 88 gives exp(88) (its arguments are s - max <= 0 up to
// rounding); every other input gives bit for bit what 0.2.0 gave (tests/golden relies on it).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

extern "C" float ratest_exp(float x);
extern "C" float ratest_exp_0_2_0(float x);

namespace {

uint32_t bits(float f)
{
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

float from_bits(uint32_t u)
{
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

} // namespace

TEST_CASE("ra__exp of NaN, infinities and huge arguments", "[exp]")
{
    const float inf = std::numeric_limits<float>::infinity();
    CHECK(std::isnan(ratest_exp(std::numeric_limits<float>::quiet_NaN())));
    CHECK(std::isnan(ratest_exp(-std::numeric_limits<float>::quiet_NaN())));
    CHECK(std::isnan(ratest_exp(from_bits(0x7f800001u)))); // a signalling NaN
    CHECK(std::isnan(ratest_exp(from_bits(0xffffffffu))));
    CHECK(ratest_exp(-inf) == 0.0f);
    CHECK(ratest_exp(-3e38f) == 0.0f);
    CHECK(ratest_exp(-87.31f) == 0.0f);
    const float e88 = ratest_exp(88.0f);
    CHECK(std::isfinite(e88));
    CHECK(std::fabs(e88 / std::exp(88.0) - 1.0) < 1e-6);
    CHECK(ratest_exp(inf) == e88);
    CHECK(ratest_exp(3e38f) == e88);
    CHECK(ratest_exp(0.0f) == 1.0f);
}

TEST_CASE("ra__exp is bitwise unchanged for every number", "[exp]")
{
    // Every 61st bit pattern (both signs, all exponents) and every float in [-88, 0.5]
    // near the places that matter (0, the clamps) are compared with 0.2.0's formula.
    int64_t differ = 0, compared = 0;
    for (uint64_t u = 0; u <= 0xffffffffu; u += 61) {
        const float x = from_bits((uint32_t)u);
        if (std::isnan(x)) continue;
        differ += bits(ratest_exp(x)) != bits(ratest_exp_0_2_0(x));
        ++compared;
    }
    for (float edge : {0.0f, -87.3f, 88.0f, -1.0f, -10.0f}) {
        float x = edge;
        for (int i = 0; i < 100000; ++i) x = std::nextafter(x, -1e9f);
        for (int i = 0; i < 200000; ++i, x = std::nextafter(x, 1e9f)) {
            differ += bits(ratest_exp(x)) != bits(ratest_exp_0_2_0(x));
            ++compared;
        }
    }
    INFO(compared << " inputs compared");
    CHECK(differ == 0);
}
