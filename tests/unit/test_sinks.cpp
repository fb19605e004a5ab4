// SPEC 11: attention sinks (a per-head logit joining every row's softmax once, value 0) and the
// LSE's gradient (dlse), on the backend under test: one rank and rings of 2 and 3 ranks under
// every layout, every mask of the ring catalogue (windows so narrow that rows and whole shards
// see no key), GQA, softcap, ALiBi, every dtype, against the float64 oracle under SPEC 9 with
// outputs poisoned first; dsinks summed over the ranks equals the oracle's. The oracle's own
// dsinks and dlse terms are checked by central differences in float64. A NaN sink gives NaN
// rows of its head only; -inf is no sink; dsinks without sinks is refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <string>

#include "ring/ring_check.hpp"
#include "support/cases.hpp"
#include "support/finite_diff.hpp"

using ratest::AttnConfig;
using ratest::Problem;

namespace {

// Sinks around the logits' scale (some above every logit of a row, so that the sink dominates),
// one head without a sink (-inf) when `some_off`; dlse from N(0, 1) when `with_dlse`.
void add_sinks(AttnConfig &c, std::mt19937_64 &rng, bool some_off, bool with_dlse)
{
    std::normal_distribution<double> nd(0.0, 2.0);
    c.sinks.resize((size_t)c.H);
    for (double &s : c.sinks) s = nd(rng);
    if (some_off) c.sinks[(size_t)(rng() % (uint64_t)c.H)] = -INFINITY;
    if (!with_dlse) return;
    std::normal_distribution<double> g(0.0, 1.0);
    c.dlse.resize((size_t)(c.H * c.Tq()));
    for (double &x : c.dlse) x = g(rng);
}

} // namespace

TEST_CASE("sinks and dlse on one rank: every mask, dtype, GQA, softcap and ALiBi", "[sinks]")
{
    uint64_t it = 0;
    for (ringattn_dtype_t dt : ratest::all_dtypes)
        for (const ratest::Mask &m : ratest::ring_masks) {
            std::mt19937_64 rng(ratest::seed_for("sinks one rank", it++));
            AttnConfig c = ratest::ring_batch(m, dt);
            if (it % 3 == 0) c.softcap = 5.0f;
            if (it % 4 == 1) c.alibi = ratest::alibi_slopes(c.H);
            add_sinks(c, rng, it % 2 == 0, it % 3 != 1);
            INFO("dtype " << dt << ", mask " << m.name);
            ratest::CaseOpts o;
            o.determinism = it % 5 == 0;
            ratest::run_case(c, rng, o);
        }
}

TEST_CASE("sinks with rows that have no allowed key: O = 0, LSE = sink, dsinks = dlse",
          "[sinks]")
{
    std::mt19937_64 rng(ratest::seed_for("sinks empty rows", 0));
    AttnConfig c = ratest::ring_batch({"window narrow", 1, 5, 0});
    // 40 queries against 10 keys, bottom-right aligned: the first 30 queries see no key
    c.cu_q = {0, 40};
    c.cu_k = {0, 10};
    add_sinks(c, rng, false, true);
    ratest::run_case(c, rng);
}

TEST_CASE("sinks and dlse in a ring: added once per row, dsinks per rank summing to the oracle's",
          "[sinks][ring]")
{
    uint64_t it = 0;
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16})
        for (const ratest::Mask &m : ratest::ring_masks) {
            std::mt19937_64 rng(ratest::seed_for("sinks ring", it++));
            AttnConfig c = ratest::ring_batch(m, dt);
            add_sinks(c, rng, it % 2 == 0, it % 3 != 0);
            const Problem pb = ratest::packed_problem(c, ratest::seed_for("sinks ring pb", it));
            INFO("dtype " << dt << ", mask " << m.name);
            ringtest::check_every_layout(pb, ratest::emulated() ? std::vector<int>{3}
                                                                : std::vector<int>{2, 3});
        }
}

TEST_CASE("the oracle's dsinks and dlse terms equal central differences in float64", "[sinks][fd]")
{
    for (bool softcap : {false, true}) {
        std::mt19937_64 rng(ratest::seed_for("sinks fd", softcap));
        AttnConfig c = ratest::fd_config({"causal+window", true, 3, 0, softcap ? 5.0f : 0.0f,
                                          false, 0.0f, 4, 2},
                                         0);
        add_sinks(c, rng, true, true);
        const ratest::Dense Q = ratest::random_dense(rng, c.Tq(), c.H, c.D, 1.0);
        const ratest::Dense K = ratest::random_dense(rng, c.Tk(), c.hkv(), c.D, 1.0);
        const ratest::Dense V = ratest::random_dense(rng, c.Tk(), c.hkv(), c.dv(), 1.0);
        const ratest::Dense G = ratest::random_dense(rng, c.Tq(), c.H, c.dv(), 1.0);
        // L = sum(O G) + sum(LSE dlse), whose gradients the backward with dO = G, dlse returns
        auto loss = [&](const AttnConfig &cc, const ratest::Dense &q) {
            const ratest::FwdResult r = ratest::oracle_forward(cc, q, K, V);
            double L = 0;
            for (size_t i = 0; i < G.v.size(); ++i) L += r.O.v[i] * G.v[i];
            for (size_t i = 0; i < r.lse.size(); ++i)
                if (std::isfinite(r.lse[i])) L += r.lse[i] * cc.dlse[i];
            return L;
        };
        const ratest::FwdResult f = ratest::oracle_forward(c, Q, K, V);
        const ratest::BwdResult b = ratest::oracle_backward(c, Q, K, V, f.O, f.lse, G);
        AttnConfig cs = c;
        const std::vector<double> nsink =
            ratest::central_differences(cs.sinks, [&] { return loss(cs, Q); });
        ratest::Dense q = Q, nq(c.Tq(), c.H, c.D);
        nq.v = ratest::central_differences(q.v, [&] { return loss(c, q); });
        ratest::Dense ns(1, c.H, 1);
        for (int h = 0; h < c.H; ++h) {
            ns.v[(size_t)h] = std::isinf(c.sinks[(size_t)h]) ? 0.0 : nsink[(size_t)h];
            INFO("head " << h << " dsink " << b.dSinks.v[(size_t)h] << " fd " << ns.v[(size_t)h]);
            CHECK(std::fabs(b.dSinks.v[(size_t)h] - ns.v[(size_t)h]) < 1e-8);
        }
        CHECK(ratest::max_rel_err(b.dQ, nq) < 1e-8);
        // the differences see the sinks and dlse: without them the gradients differ
        AttnConfig plain = c;
        plain.sinks.clear(), plain.dlse.clear();
        const ratest::FwdResult pf = ratest::oracle_forward(plain, Q, K, V);
        CHECK(ratest::max_rel_err(ratest::oracle_backward(plain, Q, K, V, pf.O, pf.lse, G).dQ, nq) >
              1e-3);
    }
}

TEST_CASE("a NaN sink makes its head's rows NaN, the others' untouched; -inf is no sink",
          "[sinks]")
{
    std::mt19937_64 rng(ratest::seed_for("sinks nan", 0));
    AttnConfig c = ratest::ring_batch({"causal", 1, -1, -1});
    Problem none = ratest::packed_problem(c, 5);
    c.sinks = {NAN, -INFINITY, 0.5, -INFINITY};
    Problem pb = ratest::packed_problem(c, 5);
    ratest::Plan plan(c);
    ratest::require_plan(plan);
    ratest::run_both(plan, pb);
    ratest::run_both(plan, none);
    const int64_t T = c.Tq();
    for (int64_t t = 0; t < T; ++t) {
        INFO("row " << t);
        CHECK(std::isnan(pb.lse[(size_t)t]));
        CHECK(std::isnan(pb.o.get(t, 0, 0)));
        CHECK(pb.lse[(size_t)(T + t)] == none.lse[(size_t)(T + t)]); // -inf: bitwise no sink
        CHECK(pb.o.get(t, 1, 3) == none.o.get(t, 1, 3));
        CHECK(!std::isnan(pb.lse[(size_t)(2 * T + t)]));
    }
    CHECK(std::isnan(pb.dsinks_buf[0]));
    CHECK(pb.dsinks_buf[1] == 0.0f);
    CHECK(pb.dsinks_buf[3] == 0.0f);
}

TEST_CASE("dsinks without sinks is refused, nothing written", "[sinks][validation]")
{
    AttnConfig c = ratest::ring_batch({"causal", 1, -1, -1});
    Problem pb = ratest::packed_problem(c, 3);
    ratest::Plan plan(c);
    ratest::require_plan(plan);
    REQUIRE(ratest::run_forward(plan, pb) == RINGATTN_SUCCESS);
    float dsinks[4] = {7, 7, 7, 7};
    ringattn_tensors_t t = pb.tensors();
    ratest::Mirror m;
    t.dsinks = static_cast<float *>(m.bind(dsinks, sizeof dsinks));
    CHECK(ringattn_backward(plan.get(), &t, nullptr) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(std::string(ringattn_last_error()).find("dsinks") != std::string::npos);
    m.download();
    CHECK(dsinks[0] == 7.0f);
}
