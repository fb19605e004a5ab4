// SPEC 6 selection at sequence lengths past 2^30 keys (masks/topk.c, compiled in): the index
// arithmetic of the Fenwick tree and of the heap sort must not overflow int32 for any length
// up to INT32_MAX. The arrays are reservations of address space (MAP_NORESERVE): only the few
// pages a walk touches become memory.
#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "masks/topk.h"

namespace {

// n zero-filled elements of T, without memory behind them until touched; nullptr if the
// address space is not there (ulimit -v, overcommit disabled).
template <class T>
struct Sparse {
    T *data = nullptr;
    size_t bytes;
    explicit Sparse(size_t n) : bytes(n * sizeof(T))
    {
        void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        data = p == MAP_FAILED ? nullptr : static_cast<T *>(p);
    }
    ~Sparse()
    {
        if (data) munmap(data, bytes);
    }
};

// Ranks around the int32 edges: 2^30 +- 1, 2^31 - 2, and small ones.
const int32_t N = INT32_MAX;
const int32_t ranks[] = {0, 1, 77, ((int32_t)1 << 30) - 1, (int32_t)1 << 30, ((int32_t)1 << 30) + 1,
                         INT32_MAX - 2, INT32_MAX - 1};

} // namespace

TEST_CASE("Fenwick tree of INT32_MAX ranks: add and k-th", "[topk][limits]")
{
    Sparse<int32_t> fen((size_t)N + 1);
    if (!fen.data) {
        WARN("no 8 GiB of address space: skipped");
        return;
    }
    // Adding rank r walks r + 1, r + 1 + lowbit, ... up to N: past 2^30 the next index is above
    // INT32_MAX and must end the walk, not wrap.
    int32_t count = 0;
    for (int32_t r : ranks) {
        ra__topk_fen_add(fen.data, N, r, 1);
        ++count;
        // the k-th smallest rank in the tree, for every k so far
        std::vector<int32_t> in(ranks, ranks + count);
        std::sort(in.begin(), in.end());
        for (int32_t k = 1; k <= count; ++k) {
            INFO("after adding rank " << r << ", k = " << k);
            CHECK(ra__topk_fen_kth(fen.data, N, k) == in[(size_t)k - 1]);
        }
    }
    for (int32_t r : ranks) ra__topk_fen_add(fen.data, N, r, -1);
    CHECK(fen.data[(size_t)1 << 30] == 0);
}

TEST_CASE("Fenwick k-th with n just above 2^30", "[topk][limits]")
{
    const int32_t n = ((int32_t)1 << 30) + 3;
    Sparse<int32_t> fen((size_t)n + 1);
    if (!fen.data) {
        WARN("no 4 GiB of address space: skipped");
        return;
    }
    ra__topk_fen_add(fen.data, n, n - 1, 1);
    ra__topk_fen_add(fen.data, n, 5, 1);
    CHECK(ra__topk_fen_kth(fen.data, n, 1) == 5);
    CHECK(ra__topk_fen_kth(fen.data, n, 2) == n - 1);
}

TEST_CASE("heap sort of INT32_MAX keys: a node past 2^30 is a leaf", "[topk][limits]")
{
    Sparse<ra_topk_key> a((size_t)N);
    if (!a.data) {
        WARN("no 16 GiB of address space: skipped");
        return;
    }
    // Node i's children are 2i + 1 and 2i + 2: past 2^30 they are beyond n, nothing moves.
    for (int32_t i : {((int32_t)1 << 30) + 5, INT32_MAX - 1}) {
        a.data[i] = ra_topk_key{-1.0f, i};
        ra__topk_sift_down(a.data, i, N);
        CHECK(a.data[i].pos == i);
        CHECK(a.data[i].bias == -1.0f);
    }
    // 2^30 - 1 is the last node whose first child index fits int32, and is a leaf too: that
    // child would be 2^31 - 1 = n.
    const int32_t i = ((int32_t)1 << 30) - 1;
    a.data[i] = ra_topk_key{-1.0f, i};
    ra__topk_sift_down(a.data, i, N);
    CHECK(a.data[i].pos == i);
    // Its sibling-led neighbour moves: node j = 2^30 - 2 has children 2^31 - 3 and 2^31 - 2, and
    // the heap keeps the last in rank order on top (the lowest bias): a parent of bias 8 over
    // children 7 and 6 swaps with the 6, at 2^31 - 2, whose children would be past 2^32.
    const int32_t j = ((int32_t)1 << 30) - 2;
    a.data[j] = ra_topk_key{8.0f, 1};
    a.data[(size_t)2 * j + 1] = ra_topk_key{7.0f, 2};
    a.data[(size_t)2 * j + 2] = ra_topk_key{6.0f, 3};
    ra__topk_sift_down(a.data, j, N);
    CHECK(a.data[j].bias == 6.0f);
    CHECK(a.data[(size_t)2 * j + 1].bias == 7.0f);
    CHECK(a.data[(size_t)2 * j + 2].bias == 8.0f);
}
