// The guarded online-softmax state of SPEC 4 and the merge weights of SPEC 5
// (kernels/softmax_state.h, header-only): SPEC 10 cases 5 and 6 against float64.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/softmax_state.h"

namespace {

const float NINF = -std::numeric_limits<float>::infinity();

// One row: logits s[j] (some -inf = masked) and values v[j * dv + c].
struct Row {
    int n = 0, dv = 0;
    std::vector<float> s, v;
};

Row random_row(std::mt19937_64 &rng, int n, int dv, double masked_frac, double logit_sigma,
               double logit_offset = 0.0)
{
    Row r;
    r.n = n;
    r.dv = dv;
    std::normal_distribution<double> nd(0.0, 1.0);
    std::bernoulli_distribution mask(masked_frac);
    for (int j = 0; j < n; ++j) r.s.push_back(mask(rng) ? NINF : (float)(logit_offset + logit_sigma * nd(rng)));
    for (int i = 0; i < n * dv; ++i) r.v.push_back((float)nd(rng));
    return r;
}

// float64 softmax over the keys in `keys` (indices), the reference of SPEC 4.
void ref_softmax(const Row &r, const std::vector<int> &keys, std::vector<double> &o, double &lse)
{
    o.assign((size_t)r.dv, 0.0);
    double m = -INFINITY;
    for (int j : keys)
        if (r.s[(size_t)j] != NINF) m = std::max(m, (double)r.s[(size_t)j]);
    if (m == -INFINITY) {
        lse = -INFINITY;
        return;
    }
    double l = 0;
    for (int j : keys) {
        if (r.s[(size_t)j] == NINF) continue;
        const double p = std::exp((double)r.s[(size_t)j] - m);
        l += p;
        for (int c = 0; c < r.dv; ++c) o[(size_t)c] += p * r.v[(size_t)(j * r.dv + c)];
    }
    for (double &x : o) x /= l;
    lse = m + std::log(l);
}

struct State {
    float m = 12345.f, l = -3.f; // garbage: init must overwrite
    std::vector<float> acc;
    explicit State(int dv) : acc((size_t)dv, NAN) { ra__state_init(&m, &l, acc.data(), dv); }
};

// Feed the keys listed in `block` (any subset, any order) as one block.
void feed(State &st, const Row &r, const std::vector<int> &block)
{
    std::vector<float> s, v;
    for (int j : block) {
        s.push_back(r.s[(size_t)j]);
        for (int c = 0; c < r.dv; ++c) v.push_back(r.v[(size_t)(j * r.dv + c)]);
    }
    ra__state_update(&st.m, &st.l, st.acc.data(), r.dv, s.data(), (int)block.size(), v.data(), r.dv);
}

void finalize(const State &st, int dv, std::vector<float> &o, float &lse)
{
    o.assign((size_t)dv, NAN);
    lse = NAN;
    ra__state_finalize(st.m, st.l, -INFINITY, st.acc.data(), dv, o.data(), &lse);
}

double max_abs(const std::vector<double> &x)
{
    double m = 0;
    for (double v : x) m = std::max(m, std::fabs(v));
    return m;
}

// |got - ref| / max(|ref|): NaN-propagating.
double rel_err(const std::vector<float> &got, const std::vector<double> &ref)
{
    double num = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double d = std::fabs((double)got[i] - ref[i]);
        if (!(d <= num)) num = d;
    }
    const double den = max_abs(ref);
    return den > 0 ? num / den : num;
}

bool all_finite(const std::vector<float> &x)
{
    return std::all_of(x.begin(), x.end(), [](float f) { return std::isfinite(f); });
}

bool all_zero(const std::vector<float> &x)
{
    return std::all_of(x.begin(), x.end(), [](float f) { return f == 0.0f; });
}

// Partition 0..n-1 into blocks of `bs` keys: contiguous or after a random permutation, blocks
// visited in a random order.
std::vector<std::vector<int>> partition(std::mt19937_64 &rng, int n, int bs, bool scatter)
{
    std::vector<int> keys((size_t)n);
    std::iota(keys.begin(), keys.end(), 0);
    if (scatter) std::shuffle(keys.begin(), keys.end(), rng);
    std::vector<std::vector<int>> blocks;
    for (int b = 0; b < n; b += bs) blocks.emplace_back(keys.begin() + b, keys.begin() + std::min(n, b + bs));
    std::shuffle(blocks.begin(), blocks.end(), rng);
    return blocks;
}

} // namespace

TEST_CASE("SPEC 10 case 5: any partition and order of keys gives the single-pass result", "[state]")
{
    std::mt19937_64 rng(0x73746174655f35ull);
    const int block_sizes[] = {1, 7, 64, 512};
    int cases = 0;
    for (int it = 0; it < 60; ++it) {
        const int bs = block_sizes[it % 4];
        // lengths not divisible by the block size (and a few shorter than one block)
        int n = std::uniform_int_distribution<int>(1, it % 4 == 3 ? 1500 : 700)(rng);
        if (bs > 1 && n % bs == 0) ++n;
        const int dv = std::uniform_int_distribution<int>(1, 48)(rng);
        const double masked = (it % 3) * 0.3;           // 0, 30%, 60% masked keys
        const double sigma = it % 5 == 0 ? 20.0 : 2.0;  // peaky or smooth softmax
        const Row r = random_row(rng, n, dv, masked, sigma);
        std::vector<int> all((size_t)n);
        std::iota(all.begin(), all.end(), 0);
        std::vector<double> oref;
        double lref;
        ref_softmax(r, all, oref, lref);

        State single(dv);
        feed(single, r, all);
        std::vector<float> o1;
        float lse1;
        finalize(single, dv, o1, lse1);

        for (bool scatter : {false, true}) {
            INFO("n=" << n << " dv=" << dv << " block=" << bs << " masked=" << masked
                      << " sigma=" << sigma << " scatter=" << scatter);
            State st(dv);
            for (const auto &b : partition(rng, n, bs, scatter)) feed(st, r, b);
            std::vector<float> o2;
            float lse2;
            finalize(st, dv, o2, lse2);
            if (lref == -INFINITY) {
                CHECK(lse2 == NINF);
                CHECK(all_zero(o2));
                CHECK(lse1 == NINF);
                CHECK(all_zero(o1));
                continue;
            }
            ++cases;
            const double scale = std::max(1.0, std::fabs(lref));
            // float32 rounding of a long running sum: a few ulps times sqrt(n) at most
            CHECK(rel_err(o2, oref) <= 1e-5);
            CHECK(std::fabs(lse2 - lref) / scale <= 1e-6);
            CHECK(rel_err(o1, oref) <= 1e-5);
            CHECK(std::fabs(lse1 - lref) / scale <= 1e-6);
            std::vector<double> o1d(o1.begin(), o1.end());
            CHECK(rel_err(o2, o1d) <= 2e-5);
        }
    }
    CHECK(cases > 40);
}

TEST_CASE("SPEC 4 guard: fully masked and empty blocks first, then valid blocks", "[state]")
{
    std::mt19937_64 rng(0x67756172640aull);
    for (int it = 0; it < 20; ++it) {
        const int dv = 1 + it % 17;
        Row r = random_row(rng, 300, dv, 0.0, 3.0);
        // Keys 0..99 masked: the first blocks see only -inf. Their V rows hold NaN: a masked
        // key is skipped, never multiplied.
        for (int j = 0; j < 100; ++j) {
            r.s[(size_t)j] = NINF;
            for (int c = 0; c < dv; ++c) r.v[(size_t)(j * dv + c)] = NAN;
        }
        State st(dv);
        // an empty block (n = 0) leaves the fresh state exactly as it was
        ra__state_update(&st.m, &st.l, st.acc.data(), dv, nullptr, 0, nullptr, dv);
        CHECK(st.m == NINF);
        CHECK(st.l == 0.0f);
        CHECK(all_zero(st.acc));
        std::vector<int> b0(64), b1(36), rest(200);
        std::iota(b0.begin(), b0.end(), 0);
        std::iota(b1.begin(), b1.end(), 64);
        std::iota(rest.begin(), rest.end(), 100);
        feed(st, r, b0);
        feed(st, r, b1);
        CHECK(st.m == NINF);
        CHECK(st.l == 0.0f);
        CHECK(all_zero(st.acc));
        std::vector<float> o;
        float lse;
        finalize(st, dv, o, lse); // an empty row finalises to O = 0, LSE = -inf
        CHECK(all_zero(o));
        CHECK(lse == NINF);
        for (size_t b = 0; b < rest.size(); b += 7) {
            std::vector<int> blk(rest.begin() + (ptrdiff_t)b, rest.begin() + (ptrdiff_t)std::min(rest.size(), b + 7));
            feed(st, r, blk);
            // a fully masked block in the middle changes nothing either
            feed(st, r, b1);
        }
        finalize(st, dv, o, lse);
        std::vector<double> oref;
        double lref;
        ref_softmax(r, rest, oref, lref);
        CHECK(all_finite(o));
        CHECK(rel_err(o, oref) <= 1e-5);
        CHECK(std::fabs(lse - lref) / std::max(1.0, std::fabs(lref)) <= 1e-6);
    }
}

TEST_CASE("SPEC 4: very negative valid logits are exact", "[state]")
{
    SECTION("the only valid logit is -1e30")
    {
        const int dv = 5;
        Row r;
        r.n = 600;
        r.dv = dv;
        r.s.assign(600, NINF);
        r.s[517] = -1e30f;
        std::mt19937_64 rng(77);
        std::normal_distribution<float> nd;
        for (int i = 0; i < 600 * dv; ++i) r.v.push_back(nd(rng));
        State st(dv);
        std::vector<int> b0(512), b1(88);
        std::iota(b0.begin(), b0.end(), 0);
        std::iota(b1.begin(), b1.end(), 512);
        feed(st, r, b0);
        feed(st, r, b1);
        std::vector<float> o;
        float lse;
        finalize(st, dv, o, lse);
        CHECK(lse == -1e30f);
        for (int c = 0; c < dv; ++c) CHECK(o[(size_t)c] == r.v[(size_t)(517 * dv + c)]);
    }
    SECTION("valid logits below -5e4, blocks of 7")
    {
        std::mt19937_64 rng(78);
        for (double off : {-5e4, -1e6, -3e7}) {
            Row r = random_row(rng, 200, 9, 0.3, 2.0, off);
            State st(9);
            for (const auto &b : partition(rng, 200, 7, true)) feed(st, r, b);
            std::vector<float> o;
            float lse;
            finalize(st, 9, o, lse);
            std::vector<int> all(200);
            std::iota(all.begin(), all.end(), 0);
            std::vector<double> oref;
            double lref;
            ref_softmax(r, all, oref, lref);
            INFO("offset " << off);
            CHECK(rel_err(o, oref) <= 1e-5);
            CHECK(std::fabs(lse - lref) / std::fabs(lref) <= 1e-6);
        }
    }
}

TEST_CASE("SPEC 10 case 6: merge weights with empty partials", "[state][merge]")
{
    std::mt19937_64 rng(0x6d65726765ull);
    const float PINF = std::numeric_limits<float>::infinity();
    SECTION("empty + empty (ours and FlashAttention 2's +inf)")
    {
        for (float e1 : {NINF, PINF})
            for (float e2 : {NINF, PINF}) {
                float lse[2] = {e1, e2}, w[2] = {NAN, NAN}, out = 0;
                CHECK(ra__merge_weights(lse, 2, w, &out) == 0);
                CHECK(out == NINF);
                CHECK(w[0] == 0.0f);
                CHECK(w[1] == 0.0f);
            }
    }
    SECTION("empty + x and x + empty are the identity")
    {
        for (float e : {NINF, PINF}) {
            const float x = std::normal_distribution<float>(0.f, 10.f)(rng);
            float a[2] = {e, x}, b[2] = {x, e}, w[2], out;
            CHECK(ra__merge_weights(a, 2, w, &out) == 1);
            CHECK(w[0] == 0.0f);
            CHECK(w[1] == 1.0f);
            CHECK(out == x);
            CHECK(ra__merge_weights(b, 2, w, &out) == 1);
            CHECK(w[0] == 1.0f);
            CHECK(w[1] == 0.0f);
            CHECK(out == x);
        }
    }
    SECTION("eight partials, some empty, equal the single pass")
    {
        for (int it = 0; it < 50; ++it) {
            const int n = 40 + it * 13, dv = 1 + it % 11;
            const Row r = random_row(rng, n, dv, 0.2, 4.0);
            // assign every key to one of 8 partials; partials 1, 4 and (sometimes) 6 get none
            std::vector<std::vector<int>> parts(8);
            std::uniform_int_distribution<int> pick(0, 7);
            for (int j = 0; j < n; ++j) {
                int s;
                do s = pick(rng); while (s == 1 || s == 4 || (it % 2 && s == 6));
                parts[(size_t)s].push_back(j);
            }
            std::vector<std::vector<float>> o(8);
            std::vector<float> lse(8), w(8, NAN);
            for (int s = 0; s < 8; ++s) {
                State st(dv);
                feed(st, r, parts[(size_t)s]);
                finalize(st, dv, o[(size_t)s], lse[(size_t)s]);
            }
            // empty partials: garbage O (NaN) and either marker
            for (int s : {1, 4}) std::fill(o[(size_t)s].begin(), o[(size_t)s].end(), NAN);
            lse[4] = PINF;
            float lse_m = NAN;
            const int used = ra__merge_weights(lse.data(), 8, w.data(), &lse_m);
            int expect_used = 0;
            for (int s = 0; s < 8; ++s) expect_used += lse[(size_t)s] != NINF && lse[(size_t)s] != PINF;
            CHECK(used == expect_used);
            double wsum = 0;
            std::vector<float> om((size_t)dv, 0.0f);
            for (int s = 0; s < 8; ++s) {
                CHECK(std::isfinite(w[(size_t)s]));
                if (std::isinf(lse[(size_t)s])) CHECK(w[(size_t)s] == 0.0f);
                wsum += w[(size_t)s];
                if (w[(size_t)s] == 0.0f) continue; // SPEC 5: skipped, never multiplied
                for (int c = 0; c < dv; ++c) om[(size_t)c] += w[(size_t)s] * o[(size_t)s][(size_t)c];
            }
            std::vector<int> all((size_t)n);
            std::iota(all.begin(), all.end(), 0);
            std::vector<double> oref;
            double lref;
            ref_softmax(r, all, oref, lref);
            INFO("n=" << n << " dv=" << dv);
            CHECK(std::fabs(wsum - 1.0) <= 1e-6);
            CHECK(rel_err(om, oref) <= 1e-5);
            CHECK(std::fabs(lse_m - lref) / std::max(1.0, std::fabs(lref)) <= 1e-6);
        }
    }
}
