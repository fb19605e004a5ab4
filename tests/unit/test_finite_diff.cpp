// SPEC 10 case 8: finite differences in float64. The float64 oracle's backward (SPEC 7) is checked
// against central differences of the oracle's forward for L = sum(O * G), then the library's
// float32 gradients are checked against that validated oracle backward (SPEC 9: 1e-4 normwise).
// dBias (dynamic masks, SPEC 6) is covered the same way in test_dynamic_fd.cpp.
#include <catch2/catch.hpp>

#include <random>

#include "support/cases.hpp"
#include "support/finite_diff.hpp"

using namespace ratest;

namespace {

const FdCase fd_cases[] = {
    {"plain", false, -1, -1, 0.0f, false, 0.0f, 2, 2},
    {"softcap", false, -1, -1, 1.5f, false, 0.0f, 2, 2},
    {"causal+window, GQA", true, 3, -1, 0.0f, false, 0.0f, 4, 2},
    {"causal+window, GQA, softcap", true, 3, -1, 2.0f, false, 0.0f, 4, 2},
    {"two-sided window, MQA, softcap, ALiBi, scale", false, 2, 1, 3.0f, true, 0.7f, 4, 1},
};

} // namespace

TEST_CASE("the float64 oracle's backward matches central differences", "[fd][oracle]")
{
    int idx = 0;
    for (const FdCase &fc : fd_cases) {
        std::mt19937_64 rng(seed_for("fd-oracle", (uint64_t)idx++));
        const AttnConfig c = fd_config(fc, 0);
        const FdGradients g = fd_gradients(c, rng, fd_sigma_qk(fc));
        INFO(fc.name << ": " << c.describe());
        const BwdResult &b = g.oracle;
        const Dense &nq = g.nq, &nk = g.nk, &nv = g.nv;
        // 1e-7: far above the differences' own error (~1e-10, see FD_STEP)
        CHECK(norm_rel_err(b.dQ, nq) <= 1e-7);
        CHECK(norm_rel_err(b.dK, nk) <= 1e-7);
        CHECK(norm_rel_err(b.dV, nv) <= 1e-7);
        CHECK(max_rel_err(b.dQ, nq) <= 1e-7);
        CHECK(max_rel_err(b.dK, nk) <= 1e-7);
        CHECK(max_rel_err(b.dV, nv) <= 1e-7);
        // the checks are not vacuous: every gradient is non-trivial
        CHECK(norm_rel_err(Dense(nq.T, nq.heads, nq.dim), nq) == 1.0);
        CHECK(norm_rel_err(Dense(nk.T, nk.heads, nk.dim), nk) == 1.0);
    }
}

TEST_CASE("library float32 gradients match the finite-difference-validated oracle", "[fd][bwd]")
{
    int idx = 0;
    for (const FdCase &fc : fd_cases)
        for (int size = 0; size < 2; ++size) {
            std::mt19937_64 rng(seed_for("fd-library", (uint64_t)idx++));
            // the finite-difference shapes themselves, then a larger problem of the same kind
            const AttnConfig c = fd_config(fc, size);
            INFO(fc.name);
            CaseOpts o;
            o.sigma_qk = fd_sigma_qk(fc);
            run_case(c, rng, o);
        }
}
