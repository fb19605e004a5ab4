// The tests' float64 oracle and plain same-precision implementation (support/oracle.cpp), checked
// on their own: the mask against SPEC 3's predicate (masks/mask.h), the logit formula of SPEC 2 on
// hand-computed cases, and the plain implementation's error sizes that SPEC 9's half rule scales.
// (The oracle's backward is validated by finite differences in test_finite_diff.)
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "masks/mask.h"
#include "support/cases.hpp"

using namespace ratest;

TEST_CASE("oracle mask equals ra__allowed for every pair", "[oracle]")
{
    // Q = 0 makes every allowed logit equal, and V = one-hot(key index), so O_i[j] = 1/n_i for the
    // n_i keys row i may see and 0 elsewhere.
    std::mt19937_64 rng(seed_for("oracle-mask", 0));
    for (int it = 0; it < 300; ++it) {
        AttnConfig c;
        c.H = 1;
        c.D = 1;
        std::vector<int> lq, lk;
        random_small_masked_batch(c, rng, 12, lq, lk);
        const int nseq = (int)lq.size();
        const FwdResult r = oracle_one_hot_forward(c);
        const ra_window w = {c.wl, c.causal ? 0 : c.wr};
        int bad = 0;
        for (int sq = 0; sq < nseq; ++sq)
            for (int sk = 0; sk < nseq; ++sk)
                for (int64_t i = c.cu_q[sq]; i < c.cu_q[sq + 1]; ++i) {
                    int64_t n = 0;
                    for (int64_t j = c.cu_k[sk]; j < c.cu_k[sk + 1]; ++j) {
                        const int64_t delta = (int64_t)lk[sq] - lq[sq];
                        const bool allowed = ra__allowed(w, delta, sq, i - c.cu_q[sq], sk, j - c.cu_k[sk]);
                        n += allowed && sq == sk;
                        bad += allowed != (r.O.at(i, 0, (int)j) > 0);
                    }
                    if (sq == sk) bad += (n == 0) != std::isinf(r.lse[(size_t)i]);
                    if (sq == sk && n > 0) bad += std::fabs(r.lse[(size_t)i] - std::log((double)n)) > 1e-12;
                }
        INFO(c.describe());
        CHECK(bad == 0);
    }
}

TEST_CASE("oracle logits: scale, softcap, ALiBi and delta on a hand-computed case", "[oracle]")
{
    // One query (position 1 of 2) against 3 keys (delta = 1): the query sits at key position 2.
    AttnConfig c;
    c.H = 1;
    c.D = 2;
    c.Dv = 1;
    c.cu_q = {0, 2};
    c.cu_k = {0, 3};
    c.scale = 0.5f;
    c.softcap = 2.0f;
    c.alibi = {0.25f};
    Dense Q(2, 1, 2), K(3, 1, 2), V(3, 1, 1);
    Q.at(1, 0, 0) = 1.0;
    Q.at(1, 0, 1) = 2.0;
    const double kv[3][2] = {{1, 0}, {0, 1}, {3, -1}};
    for (int j = 0; j < 3; ++j) {
        K.at(j, 0, 0) = kv[j][0];
        K.at(j, 0, 1) = kv[j][1];
        V.at(j, 0, 0) = 10.0 * (j + 1);
    }
    double s[3], m = -INFINITY;
    for (int j = 0; j < 3; ++j) {
        const double z = 0.5 * (kv[j][0] * 1.0 + kv[j][1] * 2.0);
        s[j] = 2.0 * std::tanh(z / 2.0) - 0.25 * std::fabs(1 + 1 - j);
        m = std::max(m, s[j]);
    }
    double l = 0, o = 0;
    for (int j = 0; j < 3; ++j) {
        l += std::exp(s[j] - m);
        o += std::exp(s[j] - m) * 10.0 * (j + 1);
    }
    const FwdResult r = oracle_forward(c, Q, K, V);
    CHECK(r.O.at(1, 0, 0) == Approx(o / l).epsilon(1e-14));
    CHECK(r.lse[1] == Approx(m + std::log(l)).epsilon(1e-14));
    // causal with delta = 1: query 1 still sees all three keys, query 0 sees keys 0 and 1
    c.causal = true;
    const FwdResult rc = oracle_forward(c, Q, K, V);
    CHECK(rc.O.at(1, 0, 0) == Approx(o / l).epsilon(1e-14));
    const double s00 = 0.0 - 0.25 * 1.0, s01 = 0.0 - 0.25 * 0.0; // q_0 = 0: only ALiBi
    CHECK(rc.O.at(0, 0, 0) ==
          Approx((std::exp(s00) * 10 + std::exp(s01) * 20) / (std::exp(s00) + std::exp(s01))).epsilon(1e-14));
}

TEST_CASE("plain same-precision implementation: error sizes", "[oracle][half]")
{
    // The half rule compares the library with this implementation, so it must be right (float32
    // storage: float32-sized errors) and its half errors must be of the size of the dtype's
    // rounding (neither zero nor large).
    int idx = 0;
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_FLOAT16, RINGATTN_BFLOAT16})
        for (int rep = 0; rep < 3; ++rep) {
            std::mt19937_64 rng(seed_for("oracle-plain", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 4;
            c.Hkv = 2;
            c.D = 32;
            c.Dv = 24;
            c.cu_q = cu_from_lengths({40 + (int)(rng() % 60), 1 + (int)(rng() % 30)});
            c.causal = rep != 1;
            c.softcap = rep == 2 ? 5.0f : 0.0f;
            Problem pb(c, Storage::Packed, rng);
            const Dense Q = pb.q.to_dense(), K = pb.k.to_dense(), V = pb.v.to_dense(), dO = pb.dout.to_dense();
            const FwdResult ref = oracle_forward(c, Q, K, V), pl = plain_forward(c, Q, K, V);
            const BwdResult gref = oracle_backward(c, Q, K, V, ref.O, ref.lse, dO),
                            gpl = plain_backward(c, Q, K, V, pl.O, pl.lse, dO);
            const double eo = max_rel_err(pl.O, ref.O), el = spec_lse_err(pl.lse, ref.lse),
                         eq = norm_rel_err(gpl.dQ, gref.dQ), ek = norm_rel_err(gpl.dK, gref.dK),
                         ev = norm_rel_err(gpl.dV, gref.dV);
            INFO(c.describe() << " errors O " << eo << " LSE " << el << " dQ " << eq << " dK " << ek << " dV " << ev);
            CHECK(el <= 1e-6);
            if (dt == RINGATTN_FLOAT32) {
                for (double e : {eo, eq, ek, ev}) CHECK(e <= 1e-5);
            } else {
                const double u = dt == RINGATTN_FLOAT16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
                CHECK(eo > 0.05 * u);
                CHECK(eo <= 2 * u);
                for (double e : {eq, ek, ev}) {
                    CHECK(e > 0.05 * u);
                    CHECK(e <= 2 * u);
                }
            }
        }
}
