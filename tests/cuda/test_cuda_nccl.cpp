// The ring on the CUDA backend over the NCCL transport (comm/nccl.c): P ranks as threads of one
// process, each on its own communicator from one unique id and its own stream. In CI against
// the emulated library and its fake NCCL (kernels/cuda/emu/fake_nccl.cpp), which tests the
// library's use of NCCL, not NCCL: against the float64 oracle under SPEC 9 as the single-rank
// CUDA plan is, bitwise repeatable under other thread schedules and stream drain orders (a
// missing event between the call's stream and the transport's shows as a difference), and a
// rank that leaves the call makes every other rank fail with RINGATTN_ERR_COMM within the
// deadline.
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "ring/ring_check.hpp"
#include "support/cases.hpp"
#include "support/device.hpp"

using ratest::AttnConfig;
using ratest::Mask;
using ratest::Problem;
using ringtest::Result;
using ringtest::all_layouts;
using ringtest::RunOptions;

namespace {


// A build without NCCL (a CUDA build configured without RINGATTN_ENABLE_NCCL) has nothing to test.
// On a GPU, NCCL refuses two ranks of one communicator on one device ("Duplicate GPU
// detected"): there the transport is tested with processes (CUDA.md section 3), not here.
bool have_nccl()
{
    if (std::getenv("RATEST_GPU")) {
        WARN("a real GPU: NCCL refuses ranks as threads on one device; nothing to test here");
        return false;
    }
    if (dlsym(RTLD_DEFAULT, "ringattn_comm_create_nccl_id")) return true;
    WARN("this library has no NCCL transport (RINGATTN_ENABLE_NCCL=OFF): nothing to test");
    return false;
}

RunOptions over_nccl()
{
    RunOptions o;
    o.nccl = true;
    return o;
}

void check_ring(const Problem &pb, std::initializer_list<int> ranks)
{
    const ratest::Spec9 judge = ringtest::judge_of(pb);
    for (ringattn_layout_t layout : all_layouts)
        for (int n : ranks)
            ringtest::check_result(ringtest::run(pb, n, layout, over_nccl()), judge, pb,
                                   "nccl, layout " + std::to_string(layout) + ", ranks " +
                                       std::to_string(n));
}

} // namespace

TEST_CASE("NCCL ring: every layout at P = 1..4, causal, narrow windows, bf16", "[cuda][nccl]")
{
    if (!have_nccl()) return;
    uint64_t seed = 200;
    for (const Mask &m : {ratest::ring_masks[1], ratest::ring_masks[3]}) {
        INFO("mask " << m.name);
        check_ring(ratest::packed_problem(ratest::ring_batch_cuda(m), ++seed), {1, 2, 3, 4});
    }
    check_ring(ratest::packed_problem(ratest::ring_batch_cuda(ratest::ring_masks[5], RINGATTN_BFLOAT16), 210),
               {2, 4});
}

TEST_CASE("NCCL ring: key bias and a global top-k", "[cuda][nccl][dynamic]")
{
    if (!have_nccl()) return;
    int idx = 0;
    for (int keep : {0, 3}) {
        AttnConfig c = ratest::ring_batch_cuda(ratest::ring_masks[1]);
        c.key_bias_heads = idx % 2 ? 2 : 4;
        c.keep_k = keep;
        INFO("keep_k " << keep);
        check_ring(ratest::packed_problem(c, 220 + (uint64_t)idx++), {2, 4});
    }
}

TEST_CASE("NCCL ring: bitwise repeatable under other schedules and stream drain orders", "[cuda][nccl]")
{
    if (!have_nccl()) return;
    AttnConfig c = ratest::ring_batch_cuda({"causal+window", 1, 40, -1});
    c.key_bias_heads = 2;
    c.keep_k = 7;
    const Problem pb = ratest::packed_problem(c, 230);
    ratest::set_schedule(0);
    const Result a = ringtest::run(pb, 3, RINGATTN_LAYOUT_ZIGZAG, over_nccl());
    REQUIRE(a.status == RINGATTN_SUCCESS);
    for (int kind : {1, 2}) {
        ratest::set_schedule(kind, 99);
        const Result b = ringtest::run(pb, 3, RINGATTN_LAYOUT_ZIGZAG, over_nccl());
        ratest::set_schedule(0);
        REQUIRE(b.status == RINGATTN_SUCCESS);
        ringtest::check_bitwise_same(a, b);
    }
}

TEST_CASE("NCCL ring: a rank that leaves the call fails every other rank within the deadline", "[cuda][nccl][faults]")
{
    if (!have_nccl()) return;
    setenv("RINGATTN_COMM_TIMEOUT", "2", 1);
    const Problem pb = ratest::packed_problem(ratest::ring_batch_cuda(ratest::ring_masks[1]), 240);
    RunOptions opt = over_nccl();
    opt.leave_rank = 1;
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = ringtest::run(pb, 3, RINGATTN_LAYOUT_CONTIGUOUS, opt);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    unsetenv("RINGATTN_COMM_TIMEOUT");
    CHECK(r.status == RINGATTN_ERR_COMM);
    CHECK(secs < 10.0);
    INFO("seconds: " << secs);
}
