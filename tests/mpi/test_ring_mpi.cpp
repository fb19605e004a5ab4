// The ring over MPI (run by ctest under mpirun -n 2, 3 and 4): every rank's outputs are summed
// into the global result (an allreduce of exact zeros elsewhere) and judged, on every rank,
// against the float64 oracle under SPEC 9, for every layout and mask of the catalogue; a
// sub-communicator; a descriptor mismatch failing on every rank within seconds; dynamic masks
// (SPEC 6: key bias of 1, H_kv or H heads, global top-k) the same way; a comm from a Fortran
// handle (ringattn_comm_create_mpi_fortran) bitwise equal to one from the MPI_Comm, bad handles
// refused.
//
// 2D plans (Ulysses inside groups of consecutive ranks, the ring across them) for every group
// size that divides the world: under tests/multinode the 2 x 2 grid has its all-to-all inside
// each host and its ring between the hosts.
//
// RATEST_DIGEST=<prefix> (tests/multinode): every rank also writes one line per ring run, with
// FNV-1a 64 hashes of the outputs it produced itself, to <prefix>.<world rank>, so that a run
// across hosts can be compared bit for bit with a run on one host.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ring/ring_check.hpp"
#include "ringattn_mpi.h"
#include "support/cases.hpp"

using ratest::AttnConfig;
using ratest::Mask;
using ratest::Problem;
using ratest::with_bias;
using ringtest::Result;
using ringtest::all_layouts;
using ringtest::RunOptions;

namespace {

void allreduce_sum(std::vector<float> &v, MPI_Comm comm)
{
    MPI_Allreduce(MPI_IN_PLACE, v.data(), (int)v.size(), MPI_FLOAT, MPI_SUM, comm);
}

uint64_t fnv1a(const std::vector<float> &v)
{
    uint64_t h = 14695981039346656037ull;
    const auto *p = reinterpret_cast<const unsigned char *>(v.data());
    for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

// One line per ring run: the test case, the run's number in it (runs follow the same order on
// every host), the status and the hashes of this rank's own rows (the rest of r is still 0).
void write_digest(const Result &r)
{
    static FILE *out = nullptr;
    static std::string test;
    static int run = 0;
    const char *prefix = std::getenv("RATEST_DIGEST");
    if (!prefix || !*prefix) return;
    if (!out) {
        int rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        const std::string path = std::string(prefix) + "." + std::to_string(rank);
        out = std::fopen(path.c_str(), "w");
        REQUIRE(out != nullptr);
    }
    const std::string now = Catch::getResultCapture().getCurrentTestName();
    if (now != test) test = now, run = 0;
    std::fprintf(out, "%s | run %d | status %d |", test.c_str(), run++, (int)r.status);
    for (const auto *v : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv, &r.dbias})
        std::fprintf(out, " %016" PRIx64, fnv1a(*v));
    std::fprintf(out, "\n");
    std::fflush(out);
}

// The ring result over `comm`, gathered on every rank of it (fortran: the comm made from its
// Fortran handle).
Result ring_over(MPI_Comm mpi, const Problem &pb, ringattn_layout_t layout,
                 const RunOptions &opt = RunOptions(), bool fortran = false)
{
    ringattn_comm_t comm = nullptr;
    Result r;
    r.status = fortran ? ringattn_comm_create_mpi_fortran(MPI_Comm_c2f(mpi), &comm)
                       : ringattn_comm_create_mpi(mpi, &comm);
    if (r.status != RINGATTN_SUCCESS) return r;
    int rank = 0, size = 0;
    ringattn_comm_rank(comm, &rank, &size);
    r = ringtest::run_rank(pb, comm, rank, layout, opt);
    ringattn_comm_destroy(comm);
    write_digest(r);
    int failed = r.status != RINGATTN_SUCCESS, any = 0;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, mpi);
    if (any) {
        if (r.status == RINGATTN_SUCCESS) r.status = RINGATTN_ERR_COMM;
        return r;
    }
    for (auto *v : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv, &r.dbias})
        if (!v->empty()) allreduce_sum(*v, mpi);
    return r;
}

// The ring over MPI_COMM_WORLD under every layout, each within SPEC 9 of the oracle.
void check_every_layout(const Problem &pb, const std::string &what)
{
    const ratest::Spec9 judge = ringtest::judge_of(pb);
    for (ringattn_layout_t layout : all_layouts)
        ringtest::check_result(ring_over(MPI_COMM_WORLD, pb, layout), judge, pb,
                               what + ", layout " + std::to_string(layout));
}

// A 2D plan (ringattn.h: ulysses_size) over MPI_COMM_WORLD, groups of pu consecutive ranks:
// the library splits the comm, or (two_comms) the test splits MPI_COMM_WORLD itself and passes
// both comms to ringattn_plan_create_2d. Gathered on every rank as ring_over's.
Result grid_over(const Problem &pb, int pu, ringattn_layout_t layout, bool two_comms)
{
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm split[2];
    ringattn_comm_t sub[2] = {nullptr, nullptr};
    RunOptions opt;
    if (two_comms) {
        MPI_Comm_split(MPI_COMM_WORLD, rank / pu, rank, &split[0]); // my group
        MPI_Comm_split(MPI_COMM_WORLD, rank % pu, rank, &split[1]); // my place in every group
        for (int i = 0; i < 2; ++i) REQUIRE(ringattn_comm_create_mpi(split[i], &sub[i]) == 0);
        opt.make_plan = [&sub](int, ringattn_comm_t, const ringattn_plan_desc_t &d,
                               ringattn_plan_t *plan) {
            return ringattn_plan_create_2d(sub[0], sub[1], &d, plan);
        };
    } else {
        opt.desc_hook = [pu](int, ringattn_plan_desc_t &d) { d.ulysses_size = pu; };
    }
    Result r = ring_over(MPI_COMM_WORLD, pb, layout, opt);
    for (int i = 0; two_comms && i < 2; ++i) {
        ringattn_comm_destroy(sub[i]);
        MPI_Comm_free(&split[i]);
    }
    return r;
}

} // namespace

TEST_CASE("2D plans over MPI are within SPEC 9 for every grid of the world", "[mpi][ulysses]")
{
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    uint64_t seed = 900;
    const Mask masks[] = {ratest::ring_masks[1], ratest::ring_masks[3], ratest::ring_masks[4]};
    for (int pu = 2; pu < size; ++pu) {
        if (size % pu) continue;
        for (bool replicated : {false, true}) {
            // H = 12 splits over groups of 2, 3, 4 and 6; H_kv = P_u, or below it (replicated)
            for (const Mask &m : masks) {
                AttnConfig c = ratest::ring_batch(m, replicated ? RINGATTN_BFLOAT16 : RINGATTN_FLOAT32);
                c.H = 12;
                c.Hkv = replicated ? (pu % 2 ? 1 : 2) : pu;
                if (m.wl == 5) c = with_bias(c, replicated ? 1 : c.H, 11); // dynamic masks
                const Problem pb = ratest::packed_problem(c, seed++);
                const ratest::Spec9 judge = ringtest::judge_of(pb);
                for (ringattn_layout_t layout : all_layouts)
                    ringtest::check_result(grid_over(pb, pu, layout, layout == RINGATTN_LAYOUT_STRIPED),
                                           judge, pb,
                                           "grid " + std::to_string(pu) + " x " +
                                               std::to_string(size / pu) + ", mask " + m.name +
                                               ", layout " + std::to_string(layout));
            }
        }
    }
}

TEST_CASE("ring over MPI is within SPEC 9 of the oracle", "[mpi]")
{
    uint64_t seed = 100;
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16})
        for (const Mask &m : ratest::ring_masks)
            check_every_layout(ratest::packed_problem(ratest::ring_batch(m, dt), seed++),
                               std::string("dtype ") + std::to_string(dt) + ", mask " + m.name);
}

TEST_CASE("ring over an MPI sub-communicator", "[mpi]")
{
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    AttnConfig c = ratest::ring_batch({"causal+window", 1, 17, -1});
    c.cu_q = {0, 41, 130};
    const Problem pb = ratest::packed_problem(c, 7 + (uint64_t)(rank % 2)); // each half its own
    ringtest::check_result(ring_over(half, pb, RINGATTN_LAYOUT_ZIGZAG), ringtest::judge_of(pb), pb,
                           "half of the world");
    MPI_Comm_free(&half);
}

TEST_CASE("a descriptor mismatch fails on every MPI rank within seconds", "[mpi]")
{
    AttnConfig c = ratest::ring_batch({"none", 0, -1, -1});
    c.cu_q = {0, 64};
    const Problem pb = ratest::packed_problem(c, 3);
    const auto t0 = std::chrono::steady_clock::now();
    RunOptions opt;
    opt.desc_hook = [](int rank, ringattn_plan_desc_t &d) {
        if (rank == 0) d.softcap = 1.0f;
    };
    const Result r = ring_over(MPI_COMM_WORLD, pb, RINGATTN_LAYOUT_CONTIGUOUS, opt);
    CHECK(r.status == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("a NaN bias on one MPI rank fails the call on every rank within seconds", "[mpi][dynamic]")
{
    // The call's agreement: every rank refuses the call before any K/V moves, then the same
    // plans run the real call, within SPEC 9 of the oracle.
    AttnConfig c = with_bias(ratest::ring_batch({"causal", 1, -1, -1}), 2, 5);
    c.cu_q = {0, 70};
    const Problem pb = ratest::packed_problem(c, 21);
    static ratest::Mirrored<float> nans;
    nans.host.assign(4096, NAN);
    const float *nan_bias = nans.bind();
    RunOptions opt;
    opt.edit_first_call = [=](int rank, ringattn_tensors_t &t) {
        if (rank == 1) t.key_bias = nan_bias;
    };
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = ring_over(MPI_COMM_WORLD, pb, RINGATTN_LAYOUT_ZIGZAG, opt);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    CHECK(r.edited_status[(size_t)rank] == RINGATTN_ERR_INVALID_ARGUMENT);
    ringtest::check_result(r, ringtest::judge_of(pb), pb, "after the refused call");
}

TEST_CASE("ring over MPI with a key bias and top-k is within SPEC 9 of the oracle", "[mpi][dynamic]")
{
    const Mask masks[] = {ratest::ring_masks[0], ratest::ring_masks[1], ratest::ring_masks[3]};
    const int hbs[] = {1, 2, 4}; // H = 4, H_kv = 2
    int idx = 0;
    for (const Mask &m : masks)
        for (int keep : {0, 1, 3, 1000}) {
            Problem pb = ratest::packed_problem(with_bias(ratest::ring_batch(m), hbs[idx % 3], keep),
                                                4000 + (uint64_t)idx);
            if ((idx + idx / 4) % 2 == 1) pb.set_bias(ratest::quantized(pb.cfg.bias)); // ties
            ++idx;
            check_every_layout(pb, std::string("mask ") + m.name + ", H_b " +
                                       std::to_string(pb.cfg.key_bias_heads) + ", keep_k " +
                                       std::to_string(keep));
        }
    // bfloat16, one problem
    AttnConfig c = with_bias(ratest::ring_batch({"causal+window", 1, 20, -1}, RINGATTN_BFLOAT16), 2, 6);
    c.cu_q = {0, 80, 131};
    const Problem pb = ratest::packed_problem(c, 4100);
    ringtest::check_result(ring_over(MPI_COMM_WORLD, pb, RINGATTN_LAYOUT_ZIGZAG),
                           ringtest::judge_of(pb), pb, "bfloat16");
}

TEST_CASE("ring over MPI: top-k is global, a row's top keys on another rank", "[mpi][dynamic]")
{
    // Causal, keep_k = 5, the five largest biases on tokens 0..4 (rank 0's shard under the
    // contiguous layout): every later row keeps only keys of rank 0.
    AttnConfig c = with_bias(ratest::ring_batch({"causal", 1, -1, -1}), 1, 5);
    c.cu_q = {0, 150};
    Problem pb = ratest::packed_problem(c, 4200, 0.5);
    std::vector<double> b = pb.cfg.bias;
    for (int i = 0; i < 5; ++i) b[(size_t)i] = 2.0 + 0.1 * i;
    pb.set_bias(b);
    const ratest::Spec9 judge = ringtest::judge_of(pb);
    for (auto layout : {RINGATTN_LAYOUT_CONTIGUOUS, RINGATTN_LAYOUT_STRIPED})
        ringtest::check_result(ring_over(MPI_COMM_WORLD, pb, layout), judge, pb,
                               "layout " + std::to_string(layout));
}

TEST_CASE("a keep_k mismatch fails on every MPI rank", "[mpi][dynamic]")
{
    AttnConfig c = with_bias(ratest::ring_batch({"none", 0, -1, -1}), 1, 3);
    c.cu_q = {0, 64};
    const Problem pb = ratest::packed_problem(c, 11);
    RunOptions opt;
    opt.desc_hook = [](int rank, ringattn_plan_desc_t &d) {
        if (rank == 1) d.keep_k = 2;
    };
    CHECK(ring_over(MPI_COMM_WORLD, pb, RINGATTN_LAYOUT_CONTIGUOUS, opt).status ==
          RINGATTN_ERR_INVALID_ARGUMENT);
}

TEST_CASE("a comm from MPI_Comm_c2f runs the ring of the MPI_Comm; bad handles are refused", "[mpi]")
{
    const AttnConfig c = with_bias(ratest::ring_batch({"causal+window", 1, 25, -1}), 2, 5);
    const Problem pb = ratest::packed_problem(c, 4300);
    const Result a = ring_over(MPI_COMM_WORLD, pb, RINGATTN_LAYOUT_ZIGZAG);
    const Result b = ring_over(MPI_COMM_WORLD, pb, RINGATTN_LAYOUT_ZIGZAG, RunOptions(), true);
    ringtest::check_result(b, ringtest::judge_of(pb), pb, "from the Fortran handle");
    ringtest::check_bitwise_same(a, b);

    const auto sentinel = reinterpret_cast<ringattn_comm_t>(0x1);
    ringattn_comm_t comm = sentinel;
    struct Bad {
        int64_t handle;
        const char *message;
    };
    std::vector<Bad> bad = {{MPI_Comm_c2f(MPI_COMM_NULL), "MPI_COMM_NULL"},
                            {int64_t(1) << 40, "expected a Fortran handle"},
                            {int64_t(INT32_MIN) - 1, "expected a Fortran handle"}};
#ifdef OPEN_MPI // its handles index a table: a value past it names no communicator
    bad.push_back({-1, "names no communicator"});
    bad.push_back({1 << 30, "names no communicator"});
#endif
    for (const Bad &b : bad) {
        const ringattn_status_t st = ringattn_comm_create_mpi_fortran(b.handle, &comm);
        INFO("handle " << b.handle << ": " << ringattn_last_error());
        CHECK(st == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(std::strstr(ringattn_last_error(), b.message) != nullptr);
        CHECK(comm == sentinel);
    }
    CHECK(ringattn_comm_create_mpi_fortran(MPI_Comm_c2f(MPI_COMM_WORLD), nullptr) ==
          RINGATTN_ERR_INVALID_ARGUMENT);
}
