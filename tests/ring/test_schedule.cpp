// The ring is cut short and carries only what the mask needs (issue: "no rank sends or receives
// a KV shard that nobody needs"): ringattn_plan_get_info against the need of every (rank, shard)
// pair computed here by brute force from the token maps and the SPEC 3 predicate.
#include <catch2/catch.hpp>

#include <mutex>
#include <thread>
#include <vector>

#include "ringattn.h"
#include "support/device.hpp"

namespace {

struct RankView {
    std::vector<int32_t> tokens;
    ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
};

std::vector<RankView> plan_all(int P, ringattn_layout_t layout, const std::vector<int32_t> &cu,
                               int wl)
{
    std::vector<ringattn_comm_t> comms((size_t)P);
    REQUIRE(ratest::make_thread_comms(P, comms.data()) == RINGATTN_SUCCESS);
    std::vector<RankView> views((size_t)P);
    std::vector<ringattn_status_t> st((size_t)P, RINGATTN_SUCCESS);
    std::vector<std::thread> threads;
    for (int r = 0; r < P; ++r)
        threads.emplace_back([&, r] {
            ringattn_plan_desc_t d = RINGATTN_PLAN_DESC_INIT;
            d.backend = ratest::test_backend();
            d.num_heads = 4;
            d.num_kv_heads = 2;
            d.head_dim = 16;
            d.head_dim_v = 8;
            d.layout = layout;
            d.num_seqs = (int)cu.size() - 1;
            d.cu_seqlens = cu.data();
            d.causal = 1;
            d.window_left = wl;
            ringattn_plan_t plan = nullptr;
            st[(size_t)r] = ringattn_plan_create(comms[(size_t)r], &d, &plan);
            if (st[(size_t)r] != RINGATTN_SUCCESS) return;
            int64_t n = 0;
            ringattn_plan_local_tokens(plan, &n, nullptr);
            views[(size_t)r].tokens.resize((size_t)n);
            ringattn_plan_local_tokens(plan, &n, views[(size_t)r].tokens.data());
            st[(size_t)r] = ringattn_plan_get_info(plan, &views[(size_t)r].info);
            ringattn_plan_destroy(plan);
        });
    for (auto &t : threads) t.join();
    for (auto c : comms) ringattn_comm_destroy(c);
    for (auto s : st) REQUIRE(s == RINGATTN_SUCCESS);
    return views;
}

// SPEC 3 for one sequence batch: does global query token i see global key token j?
bool allowed(const std::vector<int32_t> &cu, int wl, int i, int j)
{
    size_t s = 0;
    while (cu[s + 1] <= i) ++s;
    if (j < cu[s] || j >= cu[s + 1]) return false;
    return j <= i && (wl < 0 || j >= i - wl);
}

} // namespace

TEST_CASE("the ring carries exactly the shards a narrow window needs", "[ring][schedule]")
{
    const std::vector<int32_t> cu = {0, 400, 437}; // shards of ~109 tokens at P = 4
    const size_t row_bytes = 2 * (16 + 8) * sizeof(float);
    for (auto layout : {RINGATTN_LAYOUT_CONTIGUOUS, RINGATTN_LAYOUT_ZIGZAG, RINGATTN_LAYOUT_STRIPED})
        for (int P : {2, 3, 4, 6})
            for (int wl : {5, 30, -1}) {
                INFO("layout " << layout << ", ranks " << P << ", window_left " << wl);
                const auto views = plan_all(P, layout, cu, wl);
                int farthest = 0;
                for (int r = 0; r < P; ++r) {
                    size_t needed = 0;
                    for (int s = 0; s < P; ++s) {
                        if (s == r) continue;
                        bool need = false;
                        for (int32_t i : views[(size_t)r].tokens)
                            for (int32_t j : views[(size_t)s].tokens) need = need || allowed(cu, wl, i, j);
                        if (!need) continue;
                        needed += views[(size_t)s].tokens.size() * row_bytes;
                        farthest = std::max(farthest, (r - s + P) % P);
                    }
                    const auto &info = views[(size_t)r].info;
                    CHECK(info.ranks == P);
                    CHECK(info.forward_bytes_received >= needed);
                    // Contiguous shards: every shard a rank receives is one it needs.
                    if (layout == RINGATTN_LAYOUT_CONTIGUOUS) CHECK(info.forward_bytes_received == needed);
                    CHECK(info.backward_bytes_received >= info.forward_bytes_received);
                }
                for (const auto &v : views) CHECK(v.info.num_steps == farthest + 1);
            }
}
