// The ring over the threads transport (N ranks as threads), N = 1..8: output, LSE and every
// gradient equal to the single-rank plan within SPEC 9, for every layout and mask (SPEC 10
// case 9), ragged varlen batches with sequences shorter than N, GQA, float32 and bfloat16.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>

#include "ring/compare.hpp"
#include "ring/ring_harness.hpp"

using ringtest::Problem;
using ringtest::Result;

using ringtest::check_same;

namespace {

struct Mask {
    const char *name;
    int causal, wl, wr;
};

} // namespace

TEST_CASE("ring over threads equals the single-rank plan", "[ring]")
{
    // Shard length is about 160 / N; the windows are chosen against that.
    const Mask masks[] = {{"none", 0, -1, -1},        {"causal", 1, -1, -1},
                          {"window wide", 1, 60, 0},  {"window narrow", 1, 5, 0},
                          {"band both sides", 0, 7, 3}, {"causal+window", 1, 25, -1}};
    const ringattn_layout_t layouts[] = {RINGATTN_LAYOUT_CONTIGUOUS, RINGATTN_LAYOUT_ZIGZAG,
                                         RINGATTN_LAYOUT_STRIPED};
    const ringattn_dtype_t dtypes[] = {RINGATTN_FLOAT32, RINGATTN_BFLOAT16};
    uint64_t seed = 1;
    for (ringattn_dtype_t dt : dtypes)
        for (const Mask &m : masks) {
            Problem pb;
            pb.dtype = dt;
            pb.cu = {0, 97, 98, 101, 101, 160}; // ragged: lengths 97, 1, 3, 0, 59
            pb.causal = m.causal;
            pb.wl = m.wl;
            pb.wr = m.wr;
            pb.fill(seed++);
            const Result single = ringtest::run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS);
            for (ringattn_layout_t layout : layouts)
                for (int ranks = 1; ranks <= 8; ++ranks) {
                    INFO("dtype " << dt << ", mask " << m.name << ", layout " << layout
                                  << ", ranks " << ranks);
                    check_same(ringtest::run(pb, ranks, layout), single, dt);
                }
        }
}

TEST_CASE("ring with softcap, ALiBi, MQA and D_v != D", "[ring]")
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
    pb.fill(77);
    const Result single = ringtest::run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS);
    for (int ranks : {2, 3, 5})
        for (auto layout : {RINGATTN_LAYOUT_CONTIGUOUS, RINGATTN_LAYOUT_ZIGZAG,
                            RINGATTN_LAYOUT_STRIPED}) {
            INFO("ranks " << ranks << ", layout " << layout);
            check_same(ringtest::run(pb, ranks, layout), single, RINGATTN_FLOAT32);
        }
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
    CHECK(std::memcmp(a.o.data(), b.o.data(), a.o.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.dq.data(), b.dq.data(), a.dq.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.dk.data(), b.dk.data(), a.dk.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(a.dv.data(), b.dv.data(), a.dv.size() * sizeof(float)) == 0);
}

TEST_CASE("a descriptor that differs on one rank fails on every rank, quickly", "[ring]")
{
    Problem pb;
    pb.cu = {0, 64};
    pb.fill(9);
    for (int bad_rank : {0, 2}) {
        const auto t0 = std::chrono::steady_clock::now();
        const Result r = ringtest::run(pb, 4, RINGATTN_LAYOUT_CONTIGUOUS,
                                       [&](int rank, ringattn_plan_desc_t &d) {
                                           if (rank == bad_rank) d.window_left = 3;
                                       });
        CHECK(r.status == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    }
    // An invalid descriptor on one rank: its own message there, an error on the others too.
    const Result r = ringtest::run(pb, 3, RINGATTN_LAYOUT_CONTIGUOUS,
                                   [](int rank, ringattn_plan_desc_t &d) {
                                       if (rank == 1) d.num_heads = -1;
                                   });
    CHECK(r.status == RINGATTN_ERR_INVALID_ARGUMENT);
}
