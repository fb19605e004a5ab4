// Comparison of a ring result with the single-rank one within SPEC 9 (Catch2 assertions).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

#include "ring/ring_harness.hpp"

namespace ringtest {

// max |a - b| / max |b| over finite entries; any NaN, or inf where the other is not equal,
// counts as 1e30.
inline double rel_err(const std::vector<float> &a, const std::vector<float> &b, double floor = 0.0)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::isinf(b[i]) || std::isinf(a[i])) {
            if (a[i] != b[i]) return 1e30;
            continue;
        }
        if (std::isnan(a[i]) || std::isnan(b[i])) return 1e30;
        num = std::max(num, (double)std::fabs(a[i] - b[i]));
        den = std::max(den, (double)std::fabs(b[i]));
    }
    den = std::max(den, floor);
    return den > 0.0 ? num / den : num;
}

// Lower bounds of the denominators of the gradient comparisons, for gradients that cancel to
// (nearly) nothing: with keep_k = 1 every row keeps one key, so its exact dQ and its dS (hence
// dBias) are 0, and both sides hold only float32 rounding of the terms. ring_oracle.hpp makes
// them from the float64 oracle's magnitudes (1% of the largest sum of |terms|, as grad_err).
struct GradFloors {
    double dq = 0, dk = 0, dv = 0, dbias = 0;
};

inline void check_same(const Result &ring, const Result &single, ringattn_dtype_t dt,
                       const GradFloors &fl = GradFloors())
{
    REQUIRE(ring.status == RINGATTN_SUCCESS);
    REQUIRE(single.status == RINGATTN_SUCCESS);
    // float32: SPEC 9 bounds. bfloat16: both sides compute in float32 from the same inputs and
    // round once at the end, so they differ by at most a rounding flip (2^-8 relative).
    const double to = dt == RINGATTN_FLOAT32 ? 1e-5 : 8e-3;
    const double tg = dt == RINGATTN_FLOAT32 ? 1e-4 : 1.6e-2;
    CHECK(rel_err(ring.o, single.o) <= to);
    CHECK(rel_err(ring.lse, single.lse) <= 1e-5);
    CHECK(rel_err(ring.dq, single.dq, fl.dq) <= tg);
    CHECK(rel_err(ring.dk, single.dk, fl.dk) <= tg);
    CHECK(rel_err(ring.dv, single.dv, fl.dv) <= tg);
    REQUIRE(ring.dbias.size() == single.dbias.size());
    if (!single.dbias.empty()) CHECK(rel_err(ring.dbias, single.dbias, fl.dbias) <= tg);
}

inline bool same_bits(const std::vector<float> &a, const std::vector<float> &b)
{
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Two runs of the same problem bitwise equal: O, LSE, dQ, dK, dV and, where there is one, dBias
// (one CHECK each).
inline void check_bitwise_same(const Result &a, const Result &b)
{
    CHECK(same_bits(a.o, b.o));
    CHECK(same_bits(a.lse, b.lse));
    CHECK(same_bits(a.dq, b.dq));
    CHECK(same_bits(a.dk, b.dk));
    CHECK(same_bits(a.dv, b.dv));
    if (!a.dbias.empty()) CHECK(same_bits(a.dbias, b.dbias));
}

} // namespace ringtest
