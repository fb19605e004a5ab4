// The ring over the threads transport (N ranks as threads), N = 1..8: output, LSE and every
// gradient equal to the single-rank plan within SPEC 9, for every layout and mask (SPEC 10
// case 9), ragged varlen batches with sequences shorter than N, GQA, float32 and bfloat16; and
// with dynamic masks (SPEC 6): a key bias of 1, H_kv or H heads and a top-k selection that is
// global over each sequence, not per shard.
#include <catch2/catch.hpp>

#include <chrono>
#include <functional>
#include <initializer_list>

#include "ring/compare.hpp"
#include "ring/ring_harness.hpp"
#include "ring/ring_oracle.hpp"

using ringtest::Problem;
using ringtest::Result;

using ringtest::check_same;
using ringtest::o_vs_oracle;

namespace {

const ringattn_layout_t all_layouts[] = {RINGATTN_LAYOUT_CONTIGUOUS, RINGATTN_LAYOUT_ZIGZAG,
                                         RINGATTN_LAYOUT_STRIPED};

struct Mask {
    const char *name;
    int causal, wl, wr;
};

// The ragged batch (lengths 97, 1, 3, 0, 59: sequences shorter than N, one empty) under mask m.
Problem ragged_batch(const Mask &m)
{
    Problem pb;
    pb.cu = {0, 97, 98, 101, 101, 160};
    pb.causal = m.causal;
    pb.wl = m.wl;
    pb.wr = m.wr;
    return pb;
}

// Softcap, ALiBi, MQA (H = 4, H_kv = 1) and D_v != D, causal with a window, two sequences.
Problem softcap_alibi_mqa()
{
    Problem pb;
    pb.H = 4;
    pb.Hkv = 1;
    pb.D = 40;
    pb.Dv = 24;
    pb.cu = {0, 70, 131};
    pb.causal = 1;
    pb.wl = 30;
    pb.softcap = 5.0f;
    pb.alibi = {0.5f, 0.25f, 0.125f, 0.0625f};
    return pb;
}

// The ring on each number of ranks in `ranks`, under every layout, equals the single-rank plan
// (check_same at pb's dtype; fl floors the gradient comparisons, see compare.hpp).
void check_ring_equals_single(const Problem &pb, std::initializer_list<int> ranks,
                              const ringtest::GradFloors &fl = ringtest::GradFloors())
{
    const Result single = ringtest::run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS);
    for (ringattn_layout_t layout : all_layouts)
        for (int n : ranks) {
            INFO("layout " << layout << ", ranks " << n);
            check_same(ringtest::run(pb, n, layout), single, pb.dtype, fl);
        }
}

// A descriptor that `hook` makes differ on one of `ranks` ranks fails on every rank with
// INVALID_ARGUMENT, and within seconds: no rank may wait for a partner that has given up.
void check_mismatch_fails_quickly(const Problem &pb, int ranks,
                                  const std::function<void(int, ringattn_plan_desc_t &)> &hook)
{
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = ringtest::run(pb, ranks, RINGATTN_LAYOUT_CONTIGUOUS, hook);
    CHECK(r.status == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

} // namespace

TEST_CASE("ring over threads equals the single-rank plan", "[ring]")
{
    // Shard length is about 160 / N; the windows are chosen against that.
    const Mask masks[] = {{"none", 0, -1, -1},        {"causal", 1, -1, -1},
                          {"window wide", 1, 60, 0},  {"window narrow", 1, 5, 0},
                          {"band both sides", 0, 7, 3}, {"causal+window", 1, 25, -1}};
    const ringattn_dtype_t dtypes[] = {RINGATTN_FLOAT32, RINGATTN_BFLOAT16};
    uint64_t seed = 1;
    for (ringattn_dtype_t dt : dtypes)
        for (const Mask &m : masks) {
            Problem pb = ragged_batch(m);
            pb.dtype = dt;
            pb.fill(seed++);
            INFO("dtype " << dt << ", mask " << m.name);
            check_ring_equals_single(pb, {1, 2, 3, 4, 5, 6, 7, 8});
        }
}

TEST_CASE("ring with softcap, ALiBi, MQA and D_v != D", "[ring]")
{
    Problem pb = softcap_alibi_mqa();
    pb.fill(77);
    check_ring_equals_single(pb, {2, 3, 5});
}

TEST_CASE("ring runs are bitwise repeatable", "[ring]")
{
    Problem pb;
    pb.cu = {0, 50, 123};
    pb.causal = 1;
    pb.fill(5);
    const Result a = ringtest::run(pb, 3, RINGATTN_LAYOUT_ZIGZAG);
    const Result b = ringtest::run(pb, 3, RINGATTN_LAYOUT_ZIGZAG);
    REQUIRE(a.status == RINGATTN_SUCCESS);
    ringtest::check_bitwise_same(a, b);
}

TEST_CASE("a descriptor that differs on one rank fails on every rank, quickly", "[ring]")
{
    Problem pb;
    pb.cu = {0, 64};
    pb.fill(9);
    for (int bad_rank : {0, 2})
        check_mismatch_fails_quickly(pb, 4, [&](int rank, ringattn_plan_desc_t &d) {
            if (rank == bad_rank) d.window_left = 3;
        });
    // An invalid descriptor on one rank: its own message there, an error on the others too.
    const Result r = ringtest::run(pb, 3, RINGATTN_LAYOUT_CONTIGUOUS,
                                   [](int rank, ringattn_plan_desc_t &d) {
                                       if (rank == 1) d.num_heads = -1;
                                   });
    CHECK(r.status == RINGATTN_ERR_INVALID_ARGUMENT);
}

TEST_CASE("a bad tensor on one rank fails the call on every rank, quickly; the plan stays usable", "[ring]")
{
    // Without the call's agreement the other ranks would wait for the bad rank until the comm
    // deadline (60 s by default), and its next call could meet their messages.
    Problem pb;
    pb.cu = {0, 50, 96};
    pb.causal = 1;
    pb.key_bias_heads = 2;
    pb.keep_k = 7;
    pb.fill(11);
    const Result single = ringtest::run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS);
    REQUIRE(single.status == RINGATTN_SUCCESS);
    static const std::vector<float> nans(4096, NAN);
    const char *what[] = {"q NULL", "lse NULL", "struct_size 0", "bias NaN"};
    for (int bad_rank : {0, 2})
        for (int kind = 0; kind < 4; ++kind) {
            INFO("bad rank " << bad_rank << ": " << what[kind]);
            Problem e = pb;
            e.edit_first_call = [=](int rank, ringattn_tensors_t &t) {
                if (rank != bad_rank) return;
                if (kind == 0) t.q.data = nullptr;
                if (kind == 1) t.lse = nullptr;
                if (kind == 2) t.struct_size = 0;
                if (kind == 3) t.key_bias = nans.data();
            };
            const auto t0 = std::chrono::steady_clock::now();
            const Result r = ringtest::run(e, 4, RINGATTN_LAYOUT_CONTIGUOUS);
            CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
            for (int rank = 0; rank < 4; ++rank) {
                INFO("rank " << rank);
                CHECK(r.edited_status[(size_t)rank] == RINGATTN_ERR_INVALID_ARGUMENT);
            }
            // the real calls that follow on the same plans are right
            REQUIRE(r.status == RINGATTN_SUCCESS);
            check_same(r, single, RINGATTN_FLOAT32, ringtest::magnitude_floors(pb));
        }
}

TEST_CASE("ring with a key bias and top-k equals the single-rank plan", "[ring][dynamic]")
{
    // H = 4, H_kv = 2: H_b cycles through 1, H_kv = 2 and H = 4. keep_k: none, 1, 3, more than
    // every sequence. The narrow window masks whole shards at larger N. Half the problems (each
    // keep_k with half the masks) have tied biases. Gradients that cancel (keep_k = 1: one key per row) are compared above the
    // oracle's magnitude floor (compare.hpp).
    const Mask masks[] = {{"none", 0, -1, -1},       {"causal", 1, -1, -1},
                          {"window narrow", 1, 5, 0}, {"band both sides", 0, 7, 3},
                          {"causal+window", 1, 25, -1}};
    const int hbs[] = {1, 2, 4};
    int idx = 0;
    for (const Mask &m : masks)
        for (int keep : {0, 1, 3, 1000}) {
            Problem pb = ragged_batch(m);
            pb.key_bias_heads = hbs[idx % 3];
            pb.keep_k = keep;
            pb.fill(1000 + (uint64_t)idx);
            if ((idx + idx / 4) % 2 == 1) pb.quantize_bias();
            ++idx;
            INFO("mask " << m.name << ", H_b " << pb.key_bias_heads << ", keep_k " << keep);
            check_ring_equals_single(pb, {1, 2, 3, 4, 5, 6, 7, 8}, ringtest::magnitude_floors(pb));
        }
}

TEST_CASE("ring with a key bias and top-k in bfloat16", "[ring][dynamic]")
{
    int idx = 0;
    for (const Mask &m : {Mask{"causal", 1, -1, -1}, Mask{"window narrow", 1, 5, 0}})
        for (int keep : {0, 3}) {
            Problem pb = ragged_batch(m);
            pb.dtype = RINGATTN_BFLOAT16;
            pb.key_bias_heads = idx % 2 ? 2 : 4;
            pb.keep_k = keep;
            pb.fill(2000 + (uint64_t)idx++);
            INFO("mask " << m.name << ", keep_k " << keep);
            check_ring_equals_single(pb, {2, 3, 5, 8}, ringtest::magnitude_floors(pb));
        }
}

TEST_CASE("ring top-k is global: a row's top keys all live on other ranks' shards", "[ring][dynamic]")
{
    // One sequence of 160 tokens, keep_k = 5, five keys with bias 2.0..2.4 and the rest N(0, 0.5).
    // Variant 0 (no mask): the five are tokens 150..154, on the last rank's shard under the
    // contiguous layout, so every other rank's rows keep only keys it does not hold. Variant 1
    // (causal): the five are tokens 0..4, on rank 0. A per-shard top-k would keep 5 keys per
    // shard, weighing e^-2 or more each: far outside the tolerances (checked: the result
    // without selection differs by more than 1%). Variant 2 (causal): every bias equal (signed
    // zeros), so the tie rule keeps tokens 0..4 in every row, wherever the layout puts them.
    for (int variant = 0; variant < 3; ++variant) {
        Problem pb;
        pb.cu = {0, 160};
        pb.causal = variant != 0;
        pb.key_bias_heads = variant == 1 ? 4 : variant == 2 ? 2 : 1;
        pb.keep_k = 5;
        pb.bias_sigma = 0.5f;
        pb.fill(3000 + (uint64_t)variant);
        const int first = variant ? 0 : 150;
        for (int hb = 0; hb < pb.key_bias_heads; ++hb)
            for (int i = 0; i < 5; ++i) pb.bias[(size_t)(hb * 160 + first + i)] = 2.0f + 0.1f * (float)i;
        if (variant == 2) // all equal: +0.0 and -0.0 alternate (equal floats, different bits)
            for (size_t i = 0; i < pb.bias.size(); ++i) pb.bias[i] = i % 3 ? 0.0f : -0.0f;
        const Result single = ringtest::run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS);
        REQUIRE(single.status == RINGATTN_SUCCESS);
        CHECK(o_vs_oracle(pb, single) <= 1e-5);
        Problem all = pb;
        all.keep_k = 0;
        CHECK(o_vs_oracle(all, single) > 1e-2); // the selection matters
        const ringtest::GradFloors fl = ringtest::magnitude_floors(pb);
        for (ringattn_layout_t layout : all_layouts)
            for (int ranks : {2, 3, 4, 8}) {
                INFO("variant " << variant << ", layout " << layout << ", ranks " << ranks);
                const Result r = ringtest::run(pb, ranks, layout);
                check_same(r, single, RINGATTN_FLOAT32, fl);
                if (r.status == RINGATTN_SUCCESS) CHECK(o_vs_oracle(pb, r) <= 1e-5);
            }
    }
}

TEST_CASE("ring with a key bias, softcap, ALiBi, MQA and D_v != D", "[ring][dynamic]")
{
    Problem pb = softcap_alibi_mqa();
    pb.key_bias_heads = 1; // = H_kv
    pb.keep_k = 9;
    pb.fill(78);
    check_ring_equals_single(pb, {2, 3, 5}, ringtest::magnitude_floors(pb));
}

TEST_CASE("ring with a key bias but dBias not wanted (NULL)", "[ring][dynamic]")
{
    // dQ, dK, dV as with dBias requested (and as the single-rank plan without it).
    Problem pb;
    pb.cu = {0, 97, 98, 101, 101, 160};
    pb.causal = 1;
    pb.wl = 40;
    pb.key_bias_heads = 4;
    pb.keep_k = 11;
    pb.fill(79);
    Problem nodb = pb;
    nodb.want_dbias = false;
    const Result single = ringtest::run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS);
    const ringtest::GradFloors fl = ringtest::magnitude_floors(pb);
    for (int ranks : {1, 3, 4})
        for (ringattn_layout_t layout : all_layouts) {
            INFO("ranks " << ranks << ", layout " << layout);
            Result r = ringtest::run(nodb, ranks, layout);
            CHECK(r.dbias.empty());
            r.dbias = single.dbias; // nothing to compare there
            check_same(r, single, RINGATTN_FLOAT32, fl);
        }
}

TEST_CASE("ring with dynamic masks is bitwise repeatable", "[ring][dynamic]")
{
    Problem pb;
    pb.cu = {0, 50, 123};
    pb.causal = 1;
    pb.key_bias_heads = 2;
    pb.keep_k = 7;
    pb.fill(6);
    const Result a = ringtest::run(pb, 3, RINGATTN_LAYOUT_ZIGZAG);
    const Result b = ringtest::run(pb, 3, RINGATTN_LAYOUT_ZIGZAG);
    REQUIRE(a.status == RINGATTN_SUCCESS);
    REQUIRE(b.status == RINGATTN_SUCCESS);
    ringtest::check_bitwise_same(a, b);
}

TEST_CASE("ring: key_bias_heads or keep_k differing on one rank fails on every rank", "[ring][dynamic]")
{
    Problem pb;
    pb.cu = {0, 64};
    pb.key_bias_heads = 2;
    pb.keep_k = 3;
    pb.fill(10);
    const std::function<void(int, ringattn_plan_desc_t &)> hooks[] = {
        [](int rank, ringattn_plan_desc_t &d) { if (rank == 1) d.keep_k = 4; },
        [](int rank, ringattn_plan_desc_t &d) { if (rank == 2) d.key_bias_heads = 1; },
        [](int rank, ringattn_plan_desc_t &d) { if (rank == 0) d.keep_k = 0; },
    };
    for (const auto &hook : hooks) check_mismatch_fails_quickly(pb, 3, hook);
}
