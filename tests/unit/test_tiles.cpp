// Tile lists (masks/tiles.c): the plan's classification of a shard's tiles against another's,
// query-major and key-major, against ra__classify_block on every pair of tiles of random
// shards (several sequences, segments of every stride, windows of every width), and the
// heaviest-first order against the pairs the runs hold.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <sstream>
#include <vector>

#include "masks/tiles.h"

namespace {

struct Shard {
    std::vector<ra_segment> segs;
    std::vector<int32_t> seq_first;
    int64_t rows = 0;
    ra_shard view() { return ra_shard{(int)segs.size(), segs.data(), seq_first.data(), rows}; }
};

using Rng = std::mt19937_64;
int64_t uni(Rng &g, int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(g); }

// Up to 3 segments of each of n sequences: contiguous, zigzag-like or strided runs.
Shard random_shard(Rng &g, int n)
{
    Shard s;
    for (int q = 0; q < n; ++q) {
        s.seq_first.push_back((int32_t)s.segs.size());
        int64_t pos = uni(g, 0, 20);
        for (int i = (int)uni(g, 0, 3); i > 0; --i) {
            const int64_t stride = uni(g, 0, 2) == 0 ? uni(g, 2, 9) : 1;
            const int64_t count = uni(g, 1, 90);
            s.segs.push_back(ra_segment{ra_span{q, pos, stride, count}, s.rows});
            s.rows += count;
            pos += stride * count + uni(g, 0, 60);
        }
    }
    s.seq_first.push_back((int32_t)s.segs.size());
    return s;
}

int64_t window(Rng &g)
{
    switch (uni(g, 0, 4)) {
    case 0: return -1;
    case 1: return 0;
    case 2: return uni(g, 1, 5);
    default: return uni(g, 1, 200);
    }
}

ra_span tile(const ra_segment &seg, int64_t t0, int block)
{
    return ra_span{seg.span.seq, seg.span.pos + t0 * seg.span.stride, seg.span.stride,
                   std::min<int64_t>(block, seg.span.count - t0)};
}

struct Pair {
    int32_t seg;
    int64_t first;
    int kind;
    bool operator==(const Pair &o) const { return seg == o.seg && first == o.first && kind == o.kind; }
};

// Every non-EMPTY tile of other that tile m of mine meets, in (segment, index) order.
std::vector<Pair> brute(ra_window w, const std::vector<int64_t> &delta, const ra_span &m,
                        bool mine_is_query, Shard &other, int ob, int64_t *work)
{
    std::vector<Pair> out;
    *work = 0;
    for (int32_t s = 0; s < (int32_t)other.segs.size(); ++s)
        for (int64_t t0 = 0; t0 < other.segs[s].span.count; t0 += ob) {
            const ra_span o = tile(other.segs[s], t0, ob);
            const ra_block_kind k = mine_is_query ? ra__classify_block(w, delta[m.seq], &m, &o, nullptr, nullptr)
                                                  : ra__classify_block(w, delta[m.seq], &o, &m, nullptr, nullptr);
            if (k == RA_BLOCK_EMPTY) continue;
            out.push_back(Pair{s, t0, (int)k});
            *work += m.count * o.count;
        }
    return out;
}

void check(ra_window w, const std::vector<int64_t> &delta, Shard &mine, bool mine_is_query,
           int block, Shard &other, int ob)
{
    INFO("window (" << w.left << ", " << w.right << "), blocks " << block << " x " << ob
                    << (mine_is_query ? ", query-major" : ", key-major"));
    const ra_shard ms = mine.view(), os = other.view();
    ra_tile_list l;
    REQUIRE(ra__tile_list_make(w, delta.data(), &ms, mine_is_query, block, &os, ob, &l) ==
            RINGATTN_SUCCESS);
    int32_t item = 0;
    for (int32_t s = 0; s < (int32_t)mine.segs.size(); ++s) {
        REQUIRE(l.seg_item[s] == item);
        for (int64_t t0 = 0; t0 < mine.segs[s].span.count; t0 += block, ++item) {
            REQUIRE(item < l.num_items);
            const ra_tile_item &it = l.items[item];
            REQUIRE(it.seg == s);
            REQUIRE(it.first == t0);
            const ra_span m = tile(mine.segs[s], t0, block);
            INFO("tile: seq " << m.seq << ", pos " << m.pos << ", stride " << m.stride << ", count "
                              << m.count << ", delta " << delta[(size_t)m.seq]);
            ra_span span;
            int64_t row;
            REQUIRE(ra__tile_item_span(&l, &ms, item, &span, &row) == m.count);
            REQUIRE((span.pos == m.pos && span.stride == m.stride && row == mine.segs[s].row + t0));
            int64_t work;
            const std::vector<Pair> want = brute(w, delta, m, mine_is_query, other, ob, &work);
            std::vector<Pair> got;
            for (int32_t r = it.run; r < it.run + it.runs; ++r) {
                const ra_tile_run &run = l.runs[r];
                REQUIRE(run.tiles > 0);
                if (r > it.run) // runs are maximal: a neighbour of one kind and segment merges
                    REQUIRE_FALSE((l.runs[r - 1].seg == run.seg && l.runs[r - 1].kind == run.kind &&
                                   l.runs[r - 1].first + (int64_t)l.runs[r - 1].tiles * ob == run.first));
                for (int32_t t = 0; t < run.tiles; ++t)
                    got.push_back(Pair{run.seg, run.first + (int64_t)t * ob, run.kind});
            }
            CAPTURE(got.size(), want.size());
            std::ostringstream runs_got;
            for (const Pair &x : got) {
                const ra_span &o = other.segs[(size_t)x.seg].span;
                runs_got << "(seq " << o.seq << ", pos " << o.pos << ", stride " << o.stride
                         << ", count " << o.count << ") from " << x.first << " kind " << x.kind
                         << "; ";
            }
            INFO("got: " << runs_got.str());
            REQUIRE(got == want);
            REQUIRE(l.work[item] == work);
        }
    }
    REQUIRE(item == l.num_items);
    REQUIRE(l.seg_item[mine.segs.size()] == item);
    // a permutation, by descending work, ties in tile order
    std::vector<int32_t> seen(l.order, l.order + l.num_items);
    std::sort(seen.begin(), seen.end());
    for (int32_t i = 0; i < l.num_items; ++i) REQUIRE(seen[(size_t)i] == i);
    for (int32_t j = 1; j < l.num_items; ++j) {
        const int32_t a = l.order[j - 1], b = l.order[j];
        REQUIRE((l.work[a] > l.work[b] || (l.work[a] == l.work[b] && a < b)));
    }
    REQUIRE(ra__tile_list_bytes(&l) >= (size_t)l.num_items * sizeof(ra_tile_item) +
                                           (size_t)l.num_runs * sizeof(ra_tile_run));
    ra__tile_list_free(&l);
    REQUIRE(l.items == nullptr);
}

} // namespace

TEST_CASE("tile lists equal the pairwise classification, both ways", "[tiles]")
{
    Rng g(20261206);
    for (int iter = 0; iter < 300; ++iter) {
        const int n = (int)uni(g, 1, 3);
        Shard q = random_shard(g, n), k = random_shard(g, n);
        std::vector<int64_t> delta;
        for (int s = 0; s < n; ++s) delta.push_back(uni(g, -40, 80));
        const ra_window w{window(g), uni(g, 0, 2) == 0 ? 0 : window(g)};
        const int bq = (int)uni(g, 1, 40), bk = (int)uni(g, 1, 40);
        check(w, delta, q, true, bq, k, bk);
        check(w, delta, k, false, bk, q, bq);
    }
}

TEST_CASE("tile lists of empty shards", "[tiles]")
{
    Shard none, some;
    none.seq_first = {0, 0};
    some.segs.push_back(ra_segment{ra_span{0, 0, 1, 10}, 0});
    some.rows = 10;
    some.seq_first = {0, 1};
    const std::vector<int64_t> delta{0};
    check(ra_window{-1, 0}, delta, none, true, 4, some, 4);
    check(ra_window{-1, 0}, delta, some, true, 4, none, 4);
}
