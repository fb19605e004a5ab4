// Finite differences of dBias and dQ with a bias (SPEC 10 case 8) and the oracle's selection
// against a brute-force rank count.
// (Dynamic mask attention, SPEC 6; the helpers are in dynamic_common.hpp.)
#include "support/finite_diff.hpp"
#include "unit/dynamic_common.hpp"

using namespace dyntest;


// ------------------------------------------------------------------------------------------
// 3. Finite differences (SPEC 10 case 8 for dBias).

namespace {

// Biases 0.37 apart per head (a shuffled ladder plus a little noise): no perturbation of 1e-5
// changes the selection, which is not differentiated (SPEC 6).
std::vector<double> ladder_bias(std::mt19937_64 &rng, int Hb, int64_t Tk)
{
    std::vector<double> b;
    std::uniform_real_distribution<double> u(-0.05, 0.05);
    for (int h = 0; h < Hb; ++h) {
        std::vector<double> l((size_t)Tk);
        for (int64_t j = 0; j < Tk; ++j) l[(size_t)j] = 0.37 * (double)j - 2.0 + u(rng);
        std::shuffle(l.begin(), l.end(), rng);
        b.insert(b.end(), l.begin(), l.end());
    }
    return b;
}

const FdCase fd_cases[] = {
    {"plain, H_b = H", false, -1, -1, 0.0f, false, 0.0f, 2, 2, 2, 0},
    {"softcap, H_b = 1", false, -1, -1, 1.5f, false, 0.0f, 2, 2, 1, 0},
    {"top-3, no mask", false, -1, -1, 0.0f, false, 0.0f, 2, 1, 1, 3},
    {"causal+window, GQA, H_b = H_kv, top-3", true, 3, -1, 0.0f, false, 0.0f, 4, 2, 2, 3},
    {"causal, GQA, softcap, H_b = H, top-2", true, -1, -1, 2.0f, false, 0.0f, 4, 2, 4, 2},
    {"two-sided window, MQA, softcap, ALiBi, scale, H_b = 1, top-2", false, 2, 1, 3.0f, true, 0.7f, 4, 1, 1, 2},
};

} // namespace

TEST_CASE("the float64 oracle's dBias and dQ with a bias match central differences", "[dynamic][fd][oracle]")
{
    int idx = 0;
    for (const FdCase &fc : fd_cases) {
        std::mt19937_64 rng(seed_for("dyn-fd-oracle", (uint64_t)idx++));
        AttnConfig c = fd_config(fc, 0);
        c.bias = ladder_bias(rng, c.key_bias_heads, c.Tk());
        const FdGradients g = fd_gradients(c, rng, fd_sigma_qk(fc));
        INFO(fc.name << ": " << c.describe());
        const BwdResult &b = g.oracle;
        const Dense &nb = g.nbias, &nq = g.nq, &nk = g.nk, &nv = g.nv;
        CHECK(norm_rel_err(b.dBias, nb) <= 1e-7);
        CHECK(max_rel_err(b.dBias, nb) <= 1e-7);
        CHECK(norm_rel_err(b.dQ, nq) <= 1e-7);
        CHECK(norm_rel_err(b.dK, nk) <= 1e-7);
        CHECK(norm_rel_err(b.dV, nv) <= 1e-7);
        // not vacuous: dBias is non-trivial, and with top-k some keys are dropped by some rows
        CHECK(norm_rel_err(Dense(nb.T, nb.heads, nb.dim), nb) == 1.0);
        CHECK(norm_rel_err(Dense(nq.T, nq.heads, nq.dim), nq) == 1.0);
        if (fc.keep_k > 0) {
            AttnConfig c0 = c;
            c0.keep_k = 0;
            CHECK(max_rel_err(oracle_forward(c0, g.Q, g.K, g.V).O, g.fwd.O) > 1e-3);
        }
    }
}

TEST_CASE("library float32 dBias matches the finite-difference-validated oracle", "[dynamic][fd][bwd]")
{
    int idx = 0;
    for (const FdCase &fc : fd_cases)
        for (int size = 0; size < 2; ++size) {
            std::mt19937_64 rng(seed_for("dyn-fd-library", (uint64_t)idx++));
            AttnConfig c = fd_config(fc, size);
            c.bias = ladder_bias(rng, c.key_bias_heads, c.Tk());
            INFO(fc.name);
            CaseOpts o;
            o.sigma_qk = fd_sigma_qk(fc);
            run_case(c, rng, o);
        }
}


TEST_CASE("oracle selection equals a brute-force rank count", "[dynamic][oracle]")
{
    // keep(i, j) <=> j valid and #{j' valid : b[j'] > b[j] or (b[j'] == b[j] and j' < j)} < keep_k
    // (which also keeps every valid key of a row with at most keep_k of them). The forward with
    // Q = 0 and V = one-hot(key) then has O_i[j] > 0 exactly on the kept keys.
    std::mt19937_64 rng(seed_for("dyn-oracle-select", 0));
    for (int it = 0; it < 200; ++it) {
        AttnConfig c;
        c.H = 2;
        c.Hkv = 1;
        c.D = 1;
        std::vector<int> lq, lk;
        random_small_masked_batch(c, rng, 14, lq, lk);
        const int nseq = (int)lq.size();
        c.key_bias_heads = 1 + (int)(rng() % 2);
        c.keep_k = (int)(rng() % 6);
        const int64_t Tk = c.Tk();
        std::uniform_int_distribution<int> q4(-4, 4);
        c.bias.resize((size_t)(c.key_bias_heads * Tk));
        for (double &x : c.bias) x = q4(rng) / 4.0; // many ties
        const FwdResult r = oracle_one_hot_forward(c);
        int bad = 0;
        for (int sq = 0; sq < nseq; ++sq) {
            const int64_t q0 = c.cu_q[sq], k0 = c.cu_k[sq], Lq = lq[sq], Lk = lk[sq], delta = Lk - Lq;
            for (int64_t p = 0; p < Lq; ++p)
                for (int h = 0; h < 2; ++h) {
                    auto valid = [&](int64_t pj) {
                        const int wr = c.causal ? 0 : c.wr;
                        return (c.wl < 0 || pj >= p + delta - c.wl) && (wr < 0 || pj <= p + delta + wr);
                    };
                    auto b = [&](int64_t pj) { return c.bias[(size_t)(c.bias_head(h) * Tk + k0 + pj)]; };
                    std::vector<int64_t> expect;
                    for (int64_t pj = 0; pj < Lk; ++pj) {
                        if (!valid(pj)) continue;
                        int64_t above = 0;
                        for (int64_t pj2 = 0; pj2 < Lk; ++pj2)
                            above += valid(pj2) && (b(pj2) > b(pj) || (b(pj2) == b(pj) && pj2 < pj));
                        if (c.keep_k == 0 || above < c.keep_k) expect.push_back(k0 + pj);
                    }
                    bad += oracle_kept_keys(c, q0 + p, h) != expect;
                    for (int64_t j = 0; j < Tk; ++j) {
                        const bool kept = std::find(expect.begin(), expect.end(), j) != expect.end();
                        bad += kept != (r.O.at(q0 + p, h, (int)j) > 0);
                    }
                }
        }
        INFO(c.describe());
        CHECK(bad == 0);
    }
}
