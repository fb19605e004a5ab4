// Comparison of a ring result with the single-rank one within SPEC 9 (Catch2 assertions).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include <catch2/catch.hpp>

#include "ring/ring_harness.hpp"

namespace ringtest {

// max |a - b| / max |b| over finite entries; any NaN, or inf where the other is not equal,
// counts as 1e30.
inline double rel_err(const std::vector<float> &a, const std::vector<float> &b)
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
    return den > 0.0 ? num / den : num;
}

inline void check_same(const Result &ring, const Result &single, ringattn_dtype_t dt)
{
    REQUIRE(ring.status == RINGATTN_SUCCESS);
    REQUIRE(single.status == RINGATTN_SUCCESS);
    // float32: SPEC 9 bounds. bfloat16: both sides compute in float32 from the same inputs and
    // round once at the end, so they differ by at most a rounding flip (2^-8 relative).
    const double to = dt == RINGATTN_FLOAT32 ? 1e-5 : 8e-3;
    const double tg = dt == RINGATTN_FLOAT32 ? 1e-4 : 1.6e-2;
    CHECK(rel_err(ring.o, single.o) <= to);
    CHECK(rel_err(ring.lse, single.lse) <= 1e-5);
    CHECK(rel_err(ring.dq, single.dq) <= tg);
    CHECK(rel_err(ring.dk, single.dk) <= tg);
    CHECK(rel_err(ring.dv, single.dv) <= tg);
}

} // namespace ringtest
