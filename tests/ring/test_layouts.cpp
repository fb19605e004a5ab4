// SPEC 8 layouts through the public API: ringattn_plan_local_tokens gives, on every rank, exactly
// the tokens an independent implementation of SPEC 8 assigns it (ragged lengths, sequences
// shorter than P, ranks with no token of a sequence), every token on exactly one rank; scatter
// and gather move rows by that map (Q-like tensors and an LSE).
#include <catch2/catch.hpp>

#include <cmath>
#include <mutex>
#include <thread>
#include <vector>

#include "ringattn.h"
#include "support/device.hpp"

namespace {

// SPEC 8, written from the text: chunk c of n of a sequence of length L, first L % n chunks one
// longer.
std::vector<int> expected_tokens(ringattn_layout_t layout, int P, int r,
                                 const std::vector<int32_t> &cu)
{
    std::vector<int> out;
    for (size_t s = 0; s + 1 < cu.size(); ++s) {
        const int L = cu[s + 1] - cu[s];
        auto chunk = [&](int n, int c) {
            const int base = L / n, extra = L % n;
            const int start = c * base + std::min(c, extra), len = base + (c < extra ? 1 : 0);
            for (int i = 0; i < len; ++i) out.push_back(cu[s] + start + i);
        };
        if (layout == RINGATTN_LAYOUT_CONTIGUOUS) chunk(P, r);
        if (layout == RINGATTN_LAYOUT_ZIGZAG) {
            chunk(2 * P, r);
            chunk(2 * P, 2 * P - 1 - r);
        }
        if (layout == RINGATTN_LAYOUT_STRIPED)
            for (int t = r; t < L; t += P) out.push_back(cu[s] + t);
    }
    return out;
}

} // namespace

TEST_CASE("local tokens, scatter and gather follow SPEC 8", "[ring][layout]")
{
    const std::vector<int32_t> cu = {0, 13, 14, 14, 17, 47}; // lengths 13, 1, 0, 3, 30
    const int T = cu.back(), H = 3, dim = ratest::backend_dim(5);
    std::vector<float> global((size_t)T * H * dim), lse_global((size_t)H * T);
    for (size_t i = 0; i < global.size(); ++i) global[i] = (float)i;
    for (size_t i = 0; i < lse_global.size(); ++i) lse_global[i] = -(float)i;
    for (auto layout : {RINGATTN_LAYOUT_CONTIGUOUS, RINGATTN_LAYOUT_ZIGZAG, RINGATTN_LAYOUT_STRIPED})
        for (int P = 1; P <= 8; ++P) {
            INFO("layout " << layout << ", ranks " << P);
            std::vector<ringattn_comm_t> comms((size_t)P);
            REQUIRE(ratest::make_thread_comms(P, comms.data()) == RINGATTN_SUCCESS);
            std::vector<int> owner((size_t)T, 0);
            std::vector<float> back((size_t)T * H * dim, NAN), lse_back((size_t)H * T, NAN);
            std::mutex mu;
            std::vector<std::string> errors;
            auto work = [&](int r) {
                auto fail = [&](const std::string &e) {
                    std::lock_guard<std::mutex> lk(mu);
                    errors.push_back("rank " + std::to_string(r) + ": " + e);
                };
                ringattn_plan_desc_t d = RINGATTN_PLAN_DESC_INIT;
                d.backend = ratest::test_backend();
                d.num_heads = H;
                d.head_dim = dim;
                d.layout = layout;
                d.num_seqs = (int)cu.size() - 1;
                d.cu_seqlens = cu.data();
                ringattn_plan_t plan = nullptr;
                if (ringattn_plan_create(comms[(size_t)r], &d, &plan) != RINGATTN_SUCCESS)
                    return fail(ringattn_last_error());
                int64_t n = -1;
                ringattn_plan_local_tokens(plan, &n, nullptr);
                std::vector<int32_t> idx((size_t)n);
                ringattn_plan_local_tokens(plan, &n, idx.data());
                const std::vector<int> want = expected_tokens(layout, P, r, cu);
                if (std::vector<int>(idx.begin(), idx.end()) != want) fail("token map differs");
                std::vector<float> local((size_t)n * H * dim + 1, NAN), lse((size_t)H * n + 1, NAN);
                ringattn_tensor_t g = {global.data(), 0, 0}, l = {local.data(), 0, 0};
                ringattn_tensor_t lg = {lse_global.data(), 1, T}, ll = {lse.data(), 1, n};
                if (ringattn_plan_scatter(plan, RINGATTN_FLOAT32, H, dim, g, l) ||
                    ringattn_plan_scatter(plan, RINGATTN_FLOAT32, H, 1, lg, ll))
                    fail(ringattn_last_error());
                for (int64_t i = 0; i < n; ++i)
                    for (int c = 0; c < H * dim; ++c)
                        if (local[(size_t)(i * H * dim + c)] != global[(size_t)idx[(size_t)i] * H * dim + c])
                            return fail("scatter moved a wrong row");
                std::lock_guard<std::mutex> lk(mu);
                for (int32_t t : idx) ++owner[(size_t)t];
                ringattn_tensor_t b = {back.data(), 0, 0}, lb = {lse_back.data(), 1, T};
                if (ringattn_plan_gather(plan, RINGATTN_FLOAT32, H, dim, l, b) ||
                    ringattn_plan_gather(plan, RINGATTN_FLOAT32, H, 1, ll, lb))
                    errors.push_back(ringattn_last_error());
                ringattn_plan_destroy(plan);
            };
            std::vector<std::thread> threads;
            for (int r = 0; r < P; ++r) threads.emplace_back(work, r);
            for (auto &th : threads) th.join();
            for (auto c : comms) ringattn_comm_destroy(c);
            for (const auto &e : errors) FAIL_CHECK(e);
            for (int t = 0; t < T; ++t) CHECK(owner[(size_t)t] == 1);
            CHECK(back == global);
            CHECK(lse_back == lse_global);
        }
}
