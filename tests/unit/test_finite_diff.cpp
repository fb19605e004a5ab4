// SPEC 10 case 8: finite differences in float64. The float64 oracle's backward (SPEC 7) is checked
// against central differences of the oracle's forward for L = sum(O * G), then the library's
// float32 gradients are checked against that validated oracle backward (SPEC 9: 1e-4 normwise).
// dBias (dynamic masks, SPEC 6) is covered the same way in test_dynamic_mask.cpp.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "support/shim.hpp"

using namespace ratest;

namespace {

Dense random_dense(std::mt19937_64 &rng, int64_t T, int H, int D, double sigma)
{
    Dense d(T, H, D);
    std::normal_distribution<double> nd(0.0, sigma);
    for (double &x : d.v) x = nd(rng);
    return d;
}

double loss(const AttnConfig &c, const Dense &Q, const Dense &K, const Dense &V, const Dense &G)
{
    const FwdResult r = oracle_forward(c, Q, K, V);
    double L = 0;
    for (size_t i = 0; i < G.v.size(); ++i) L += r.O.v[i] * G.v[i];
    return L;
}

// Central differences of the loss with respect to every element of `x` (one of Q, K, V).
Dense numeric_grad(const AttnConfig &c, Dense &Q, Dense &K, Dense &V, const Dense &G, Dense &x)
{
    const double h = 1e-5;
    Dense g(x.T, x.heads, x.dim);
    for (size_t i = 0; i < x.v.size(); ++i) {
        const double x0 = x.v[i];
        x.v[i] = x0 + h;
        const double lp = loss(c, Q, K, V, G);
        x.v[i] = x0 - h;
        const double lm = loss(c, Q, K, V, G);
        x.v[i] = x0;
        g.v[i] = (lp - lm) / (2 * h);
    }
    return g;
}

struct FdCase {
    const char *name;
    bool causal;
    int wl, wr;
    float softcap;
    bool alibi;
    float scale;
    int H, Hkv;
};

const FdCase fd_cases[] = {
    {"plain", false, -1, -1, 0.0f, false, 0.0f, 2, 2},
    {"softcap", false, -1, -1, 1.5f, false, 0.0f, 2, 2},
    {"causal+window, GQA", true, 3, -1, 0.0f, false, 0.0f, 4, 2},
    {"causal+window, GQA, softcap", true, 3, -1, 2.0f, false, 0.0f, 4, 2},
    {"two-sided window, MQA, softcap, ALiBi, scale", false, 2, 1, 3.0f, true, 0.7f, 4, 1},
};

AttnConfig fd_config(const FdCase &fc, int D, int Dv, std::vector<int> lq, std::vector<int> lk)
{
    AttnConfig c;
    c.H = fc.H;
    c.Hkv = fc.Hkv;
    c.D = D;
    c.Dv = Dv;
    c.cu_q = cu_from_lengths(lq);
    c.cu_k = cu_from_lengths(lk);
    c.causal = fc.causal;
    c.wl = fc.wl;
    c.wr = fc.wr;
    c.softcap = fc.softcap;
    if (fc.alibi) c.alibi = alibi_slopes(c.H);
    c.scale = fc.scale;
    return c;
}

} // namespace

TEST_CASE("the float64 oracle's backward matches central differences", "[fd][oracle]")
{
    int idx = 0;
    for (const FdCase &fc : fd_cases) {
        std::mt19937_64 rng(seed_for("fd-oracle", (uint64_t)idx++));
        // Sequence 1 has fewer keys than queries, so with causal masks some rows are empty.
        const AttnConfig c = fd_config(fc, 6, 5, {7, 6, 1}, {7, 3, 2});
        const double sigma = fc.softcap > 0 ? 2.0 : 1.0; // reach the curved part of tanh
        Dense Q = random_dense(rng, c.Tq(), c.H, c.D, sigma), K = random_dense(rng, c.Tk(), c.hkv(), c.D, sigma),
              V = random_dense(rng, c.Tk(), c.hkv(), c.dv(), 1.0), G = random_dense(rng, c.Tq(), c.H, c.dv(), 1.0);
        const FwdResult f = oracle_forward(c, Q, K, V);
        const BwdResult b = oracle_backward(c, Q, K, V, f.O, f.lse, G);
        INFO(fc.name << ": " << c.describe());
        const Dense nq = numeric_grad(c, Q, K, V, G, Q);
        const Dense nk = numeric_grad(c, Q, K, V, G, K);
        const Dense nv = numeric_grad(c, Q, K, V, G, V);
        // truncation O(h^2) ~ 1e-10 and cancellation ~ 1e-16 / h ~ 1e-11, relative to O(1) values
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
            AttnConfig c = size == 0 ? fd_config(fc, 6, 5, {7, 6, 1}, {7, 3, 2})
                                     : fd_config(fc, 48, 40, {90, 60, 1}, {90, 30, 70});
            if (size == 1) c.block_q = 32, c.block_k = 16;
            INFO(fc.name);
            Problem pb(c, Storage::Packed, rng, fc.softcap > 0 ? 2.0 : 1.0);
            Plan plan(c);
            INFO("plan_create: " << ringattn_last_error());
            REQUIRE(plan.ok());
            check_against_oracle(plan, pb);
        }
}
