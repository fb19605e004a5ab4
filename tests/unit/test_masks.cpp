// SPEC 3 mask classifier (masks/mask.c): ra__classify_block, ra__key_hull and ra__query_hull
// against the pairwise predicate ra__allowed on random spans.
#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <vector>

#include "masks/mask.h"

namespace {

struct Gen {
    std::mt19937_64 rng;
    explicit Gen(uint64_t seed) : rng(seed) {}
    int64_t uni(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
    bool coin(double p) { return std::bernoulli_distribution(p)(rng); }

    int64_t window(int64_t length_hint)
    {
        switch (uni(0, 5)) {
        case 0: return -1;
        case 1: return 0;
        case 2: return uni(1, 4);
        case 3: return uni(1, 40);
        case 4: return length_hint + uni(0, 3); // >= the length: unbounded in effect
        default: return (int64_t)1 << 40;       // huge
        }
    }

    ra_span span(int32_t seq)
    {
        ra_span s;
        s.seq = seq;
        s.pos = uni(0, 3) == 0 ? 0 : uni(0, 300);
        s.stride = coin(0.5) ? 1 : uni(1, coin(0.8) ? 5 : 40);
        s.count = uni(0, 9) == 0 ? 0 : uni(1, coin(0.2) ? 3 : 48);
        return s;
    }
};

int64_t at(const ra_span &s, int64_t i) { return s.pos + i * s.stride; }

// Check every property for one (window, delta, q, k) (Catch2 records failures with context).
void check_one(ra_window w, int64_t delta, const ra_span &q, const ra_span &k)
{
    INFO("window=(" << w.left << "," << w.right << ") delta=" << delta << " q={seq " << q.seq
                    << ", pos " << q.pos << ", stride " << q.stride << ", count " << q.count
                    << "} k={seq " << k.seq << ", pos " << k.pos << ", stride " << k.stride
                    << ", count " << k.count << "}");
    std::vector<int32_t> rb((size_t)q.count + 1, -7), re((size_t)q.count + 1, -7);
    const ra_block_kind kind = ra__classify_block(w, delta, &q, &k, rb.data(), re.data());
    const ra_block_kind kind_null = ra__classify_block(w, delta, &q, &k, nullptr, nullptr);
    REQUIRE(kind == kind_null);
    // the O(1) FULL test (the classifier's and the CUDA kernels') says what the pairs say below
    REQUIRE((ra__spans_full(w, delta, &q, &k) != 0) == (kind == RA_BLOCK_FULL));
    // The sentinel after the last row is never written.
    REQUIRE(rb[(size_t)q.count] == -7);
    REQUIRE(re[(size_t)q.count] == -7);

    int64_t hb = -5, he = -5;
    ra__key_hull(w, delta, &q, &k, &hb, &he);
    // the query hull of the key span: every query that sees some key of k lies inside it
    int64_t qb = -5, qe = -5;
    ra__query_hull(w, delta, &k, &q, &qb, &qe);
    bool qhull_ok = 0 <= qb && qb <= qe && qe <= q.count;

    int64_t n_allowed = 0;
    const int64_t n_pairs = q.count * k.count;
    bool rows_ok = true, hull_ok = 0 <= hb && hb <= he && he <= k.count;
    for (int64_t a = 0; a < q.count; ++a) {
        const int64_t b0 = rb[(size_t)a], b1 = re[(size_t)a];
        if (!(0 <= b0 && b0 <= b1 && b1 <= k.count)) rows_ok = false;
        for (int64_t b = 0; b < k.count; ++b) {
            const bool allowed = ra__allowed(w, delta, q.seq, at(q, a), k.seq, at(k, b)) != 0;
            n_allowed += allowed;
            if (allowed != (b >= b0 && b < b1)) rows_ok = false;
            if (allowed && !(b >= hb && b < he)) hull_ok = false;
            if (allowed && !(a >= qb && a < qe)) qhull_ok = false;
        }
    }
    CHECK(rows_ok);
    CHECK(hull_ok);
    CHECK(qhull_ok);
    if (n_allowed == 0)
        CHECK(kind == RA_BLOCK_EMPTY);
    else if (n_allowed == n_pairs)
        CHECK(kind == RA_BLOCK_FULL);
    else
        CHECK(kind == RA_BLOCK_PARTIAL);
}

void run_random(uint64_t seed, int iters, int64_t delta_lo, int64_t delta_hi)
{
    Gen g(seed);
    for (int it = 0; it < iters; ++it) {
        const int32_t sq = (int32_t)g.uni(0, 3);
        const int32_t sk = g.coin(0.85) ? sq : (int32_t)g.uni(0, 3);
        ra_span q = g.span(sq), k = g.span(sk);
        // Often put the key span near the query span so that windows cut through the block.
        if (g.coin(0.6)) k.pos = std::max<int64_t>(0, q.pos + g.uni(-60, 60));
        const int64_t len = std::max(at(q, q.count), at(k, k.count));
        ra_window w;
        w.left = g.window(len);
        w.right = g.window(len);
        if (g.coin(0.3)) w.right = 0; // causal
        const int64_t delta = g.coin(0.4) ? 0 : g.uni(delta_lo, delta_hi);
        check_one(w, delta, q, k);
    }
}

} // namespace

TEST_CASE("classify_block and key_hull agree with ra__allowed on random spans", "[masks]")
{
    run_random(0x6d61736b31ull, 20000, 0, 80);
}

TEST_CASE("classify_block and key_hull with fewer keys than queries (negative delta)", "[masks]")
{
    run_random(0x6d61736b32ull, 5000, -80, -1);
}

TEST_CASE("classify_block: hand-picked edges", "[masks]")
{
    const ra_window unbounded = {-1, -1}, causal = {-1, 0}, band = {9, 0}, zero = {0, 0};
    ra_span q = {0, 0, 1, 16}, k = {0, 0, 1, 16};
    SECTION("every window on a square block")
    {
        for (ra_window w : {unbounded, causal, band, zero}) check_one(w, 0, q, k);
    }
    SECTION("zero-count spans are EMPTY")
    {
        ra_span qe = {0, 5, 1, 0}, ke = {0, 5, 1, 0};
        CHECK(ra__classify_block(unbounded, 0, &qe, &k, nullptr, nullptr) == RA_BLOCK_EMPTY);
        CHECK(ra__classify_block(unbounded, 0, &q, &ke, nullptr, nullptr) == RA_BLOCK_EMPTY);
        check_one(unbounded, 0, qe, k);
        check_one(unbounded, 0, q, ke);
    }
    SECTION("different sequences never see each other")
    {
        ra_span k1 = {1, 0, 1, 16};
        CHECK(ra__classify_block(unbounded, 0, &q, &k1, nullptr, nullptr) == RA_BLOCK_EMPTY);
        int64_t b = -1, e = -1;
        ra__key_hull(unbounded, 0, &q, &k1, &b, &e);
        CHECK(b == e);
    }
    SECTION("unbounded window is FULL, causal diagonal block is PARTIAL, past block FULL")
    {
        CHECK(ra__classify_block(unbounded, 0, &q, &k, nullptr, nullptr) == RA_BLOCK_FULL);
        CHECK(ra__classify_block(causal, 0, &q, &k, nullptr, nullptr) == RA_BLOCK_PARTIAL);
        ra_span qlater = {0, 16, 1, 16};
        CHECK(ra__classify_block(causal, 0, &qlater, &k, nullptr, nullptr) == RA_BLOCK_FULL);
        CHECK(ra__classify_block(causal, 0, &k, &qlater, nullptr, nullptr) == RA_BLOCK_EMPTY);
    }
    SECTION("SPEC 10 case 1: the first 512-key block of a decode query at 575 with (59, 0) is EMPTY")
    {
        ra_span qd = {0, 0, 1, 1}, kb0 = {0, 0, 1, 512}, kb1 = {0, 512, 1, 64};
        const ra_window w = {59, 0};
        CHECK(ra__classify_block(w, 575, &qd, &kb0, nullptr, nullptr) == RA_BLOCK_EMPTY);
        int32_t b = -1, e = -1;
        CHECK(ra__classify_block(w, 575, &qd, &kb1, &b, &e) == RA_BLOCK_PARTIAL);
        CHECK(b == 516 - 512);
        CHECK(e == 64);
    }
    SECTION("striped spans (stride P)")
    {
        for (int64_t P : {2, 3, 4, 7})
            for (int64_t r = 0; r < P; ++r)
                for (int64_t r2 = 0; r2 < P; ++r2) {
                    ra_span qs = {0, r, P, 20}, ks = {0, r2, P, 20};
                    for (ra_window w : {unbounded, causal, band, zero, ra_window{3, 2}})
                        check_one(w, 0, qs, ks);
                }
    }
}
