// Finite differences of dBias and dQ with a bias (SPEC 10 case 8) and the oracle's selection
// against a brute-force rank count.
// (Dynamic mask attention, SPEC 6; the helpers are in dynamic_common.hpp.)
#include "unit/dynamic_common.hpp"

using namespace dyntest;


// ------------------------------------------------------------------------------------------
// 3. Finite differences (SPEC 10 case 8 for dBias).

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

const double FD_H = 1e-5;

Dense numeric_grad(const AttnConfig &c, Dense &Q, Dense &K, Dense &V, const Dense &G, Dense &x)
{
    Dense g(x.T, x.heads, x.dim);
    for (size_t i = 0; i < x.v.size(); ++i) {
        const double x0 = x.v[i];
        x.v[i] = x0 + FD_H;
        const double lp = loss(c, Q, K, V, G);
        x.v[i] = x0 - FD_H;
        const double lm = loss(c, Q, K, V, G);
        x.v[i] = x0;
        g.v[i] = (lp - lm) / (2 * FD_H);
    }
    return g;
}

Dense numeric_dbias(AttnConfig c, const Dense &Q, const Dense &K, const Dense &V, const Dense &G)
{
    Dense g(c.key_bias_heads, 1, c.Tk());
    for (size_t i = 0; i < c.bias.size(); ++i) {
        const double b0 = c.bias[i];
        c.bias[i] = b0 + FD_H;
        const double lp = loss(c, Q, K, V, G);
        c.bias[i] = b0 - FD_H;
        const double lm = loss(c, Q, K, V, G);
        c.bias[i] = b0;
        g.v[i] = (lp - lm) / (2 * FD_H);
    }
    return g;
}

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

struct FdCase {
    const char *name;
    bool causal;
    int wl, wr;
    float softcap;
    bool alibi;
    float scale;
    int H, Hkv, Hb, keep_k;
};

const FdCase fd_cases[] = {
    {"plain, H_b = H", false, -1, -1, 0.0f, false, 0.0f, 2, 2, 2, 0},
    {"softcap, H_b = 1", false, -1, -1, 1.5f, false, 0.0f, 2, 2, 1, 0},
    {"top-3, no mask", false, -1, -1, 0.0f, false, 0.0f, 2, 1, 1, 3},
    {"causal+window, GQA, H_b = H_kv, top-3", true, 3, -1, 0.0f, false, 0.0f, 4, 2, 2, 3},
    {"causal, GQA, softcap, H_b = H, top-2", true, -1, -1, 2.0f, false, 0.0f, 4, 2, 4, 2},
    {"two-sided window, MQA, softcap, ALiBi, scale, H_b = 1, top-2", false, 2, 1, 3.0f, true, 0.7f, 4, 1, 1, 2},
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
    c.key_bias_heads = fc.Hb;
    c.keep_k = fc.keep_k;
    return c;
}

} // namespace

TEST_CASE("the float64 oracle's dBias and dQ with a bias match central differences", "[dynamic][fd][oracle]")
{
    int idx = 0;
    for (const FdCase &fc : fd_cases) {
        std::mt19937_64 rng(seed_for("dyn-fd-oracle", (uint64_t)idx++));
        // Sequence 1 has fewer keys than queries (empty rows under causal masks).
        AttnConfig c = fd_config(fc, 6, 5, {7, 6, 1}, {7, 3, 2});
        c.bias = ladder_bias(rng, c.key_bias_heads, c.Tk());
        const double sigma = fc.softcap > 0 ? 2.0 : 1.0;
        Dense Q = random_dense(rng, c.Tq(), c.H, c.D, sigma), K = random_dense(rng, c.Tk(), c.hkv(), c.D, sigma),
              V = random_dense(rng, c.Tk(), c.hkv(), c.dv(), 1.0), G = random_dense(rng, c.Tq(), c.H, c.dv(), 1.0);
        const FwdResult f = oracle_forward(c, Q, K, V);
        const BwdResult b = oracle_backward(c, Q, K, V, f.O, f.lse, G);
        INFO(fc.name << ": " << c.describe());
        const Dense nb = numeric_dbias(c, Q, K, V, G);
        const Dense nq = numeric_grad(c, Q, K, V, G, Q);
        const Dense nk = numeric_grad(c, Q, K, V, G, K);
        const Dense nv = numeric_grad(c, Q, K, V, G, V);
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
            CHECK(max_rel_err(oracle_forward(c0, Q, K, V).O, f.O) > 1e-3);
        }
    }
}

TEST_CASE("library float32 dBias matches the finite-difference-validated oracle", "[dynamic][fd][bwd]")
{
    int idx = 0;
    for (const FdCase &fc : fd_cases)
        for (int size = 0; size < 2; ++size) {
            std::mt19937_64 rng(seed_for("dyn-fd-library", (uint64_t)idx++));
            AttnConfig c = size == 0 ? fd_config(fc, 6, 5, {7, 6, 1}, {7, 3, 2})
                                     : fd_config(fc, 48, 40, {90, 60, 1}, {90, 30, 70});
            if (fc.keep_k > 0 && size == 1) c.keep_k = 4 * fc.keep_k;
            if (size == 1) c.block_q = 32, c.block_k = 16;
            c.bias = ladder_bias(rng, c.key_bias_heads, c.Tk());
            INFO(fc.name);
            Problem pb(c, Storage::Packed, rng, fc.softcap > 0 ? 2.0 : 1.0);
            Plan plan(c);
            require_plan(plan);
            check_against_oracle(plan, pb);
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
        const int nseq = 1 + (int)(rng() % 3);
        for (int s = 0; s < nseq; ++s) {
            lq.push_back((int)(rng() % 14));
            lk.push_back(rng() % 3 == 0 ? (int)(rng() % 14) : lq.back() + (int)(rng() % 5));
        }
        c.cu_q = cu_from_lengths(lq);
        c.cu_k = cu_from_lengths(lk);
        c.causal = rng() % 2;
        const int ws[] = {-1, 0, 1, 3, 20};
        c.wl = ws[rng() % 5];
        c.wr = ws[rng() % 5];
        c.key_bias_heads = 1 + (int)(rng() % 2);
        c.keep_k = (int)(rng() % 6);
        const int64_t Tq = c.Tq(), Tk = c.Tk();
        std::uniform_int_distribution<int> q4(-4, 4);
        c.bias.resize((size_t)(c.key_bias_heads * Tk));
        for (double &x : c.bias) x = q4(rng) / 4.0; // many ties
        c.Dv = (int)std::max<int64_t>(1, Tk);
        Dense Q(Tq, 2, 1), K(Tk, 1, 1), V(Tk, 1, c.Dv);
        for (int64_t j = 0; j < Tk; ++j) V.at(j, 0, (int)j) = 1.0;
        const FwdResult r = oracle_forward(c, Q, K, V);
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
