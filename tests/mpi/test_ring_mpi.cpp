// The ring over MPI (run by ctest under mpirun -n 2, 3 and 4): every rank's outputs are summed
// into the global result (an allreduce of exact zeros elsewhere) and compared, on every rank,
// with the single-rank plan within SPEC 9, for every layout and mask; a sub-communicator; a
// descriptor mismatch failing on every rank within seconds; dynamic masks (SPEC 6: key bias of
// 1, H_kv or H heads, global top-k) the same way.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <mpi.h>

#include <chrono>

#include "ring/compare.hpp"
#include "ring/ring_harness.hpp"
#include "ring/ring_oracle.hpp"
#include "ringattn_mpi.h"

using namespace ringtest;

namespace {

void allreduce_sum(std::vector<float> &v, MPI_Comm comm)
{
    MPI_Allreduce(MPI_IN_PLACE, v.data(), (int)v.size(), MPI_FLOAT, MPI_SUM, comm);
}

// The ring result over `comm`, gathered on every rank of it.
Result ring_over(MPI_Comm mpi, const Problem &pb, ringattn_layout_t layout,
                 const std::function<void(int, ringattn_plan_desc_t &)> &hook = {})
{
    ringattn_comm_t comm = nullptr;
    Result r;
    r.status = ringattn_comm_create_mpi(mpi, &comm);
    if (r.status != RINGATTN_SUCCESS) return r;
    int rank = 0, size = 0;
    ringattn_comm_rank(comm, &rank, &size);
    r = run_rank(pb, comm, rank, layout, hook);
    ringattn_comm_destroy(comm);
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

} // namespace

TEST_CASE("ring over MPI equals the single-rank plan", "[mpi]")
{
    struct Mask {
        int causal, wl, wr;
    };
    const Mask masks[] = {{0, -1, -1}, {1, -1, -1}, {1, 60, 0}, {1, 5, 0}, {0, 7, 3}, {1, 25, -1}};
    uint64_t seed = 100;
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16})
        for (const Mask &m : masks) {
            Problem pb;
            pb.dtype = dt;
            pb.cu = {0, 97, 98, 101, 101, 160};
            pb.causal = m.causal;
            pb.wl = m.wl;
            pb.wr = m.wr;
            pb.fill(seed++);
            const Result single = run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS);
            for (auto layout : {RINGATTN_LAYOUT_CONTIGUOUS, RINGATTN_LAYOUT_ZIGZAG,
                                RINGATTN_LAYOUT_STRIPED}) {
                INFO("dtype " << dt << ", mask " << m.causal << "/" << m.wl << "/" << m.wr
                              << ", layout " << layout);
                check_same(ring_over(MPI_COMM_WORLD, pb, layout), single, dt);
            }
        }
}

TEST_CASE("ring over an MPI sub-communicator", "[mpi]")
{
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm half;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
    Problem pb;
    pb.cu = {0, 41, 130};
    pb.causal = 1;
    pb.wl = 17;
    pb.fill(7 + (uint64_t)(rank % 2)); // each half solves its own problem
    check_same(ring_over(half, pb, RINGATTN_LAYOUT_ZIGZAG), run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS),
               RINGATTN_FLOAT32);
    MPI_Comm_free(&half);
}

TEST_CASE("a descriptor mismatch fails on every MPI rank within seconds", "[mpi]")
{
    Problem pb;
    pb.cu = {0, 64};
    pb.fill(3);
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = ring_over(MPI_COMM_WORLD, pb, RINGATTN_LAYOUT_CONTIGUOUS,
                               [](int rank, ringattn_plan_desc_t &d) {
                                   if (rank == 0) d.softcap = 1.0f;
                               });
    CHECK(r.status == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
}

TEST_CASE("a NaN bias on one MPI rank fails the call on every rank within seconds", "[mpi][dynamic]")
{
    // The call's agreement: every rank refuses the call before any K/V moves, then the same
    // plans run the real call, equal to the single-rank plan.
    Problem pb;
    pb.cu = {0, 70};
    pb.causal = 1;
    pb.key_bias_heads = 2;
    pb.keep_k = 5;
    pb.fill(21);
    const Result single = run(pb, 0, RINGATTN_LAYOUT_ZIGZAG);
    REQUIRE(single.status == RINGATTN_SUCCESS);
    static const std::vector<float> nans(4096, NAN);
    pb.edit_first_call = [](int rank, ringattn_tensors_t &t) {
        if (rank == 1) t.key_bias = nans.data();
    };
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = ring_over(MPI_COMM_WORLD, pb, RINGATTN_LAYOUT_ZIGZAG);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    CHECK(r.edited_status[(size_t)rank] == RINGATTN_ERR_INVALID_ARGUMENT);
    REQUIRE(r.status == RINGATTN_SUCCESS);
    check_same(r, single, RINGATTN_FLOAT32, magnitude_floors(pb));
}

TEST_CASE("ring over MPI with a key bias and top-k equals the single-rank plan", "[mpi][dynamic]")
{
    struct Mask {
        int causal, wl, wr;
    };
    const Mask masks[] = {{0, -1, -1}, {1, -1, -1}, {1, 5, 0}};
    const int hbs[] = {1, 2, 4}; // H = 4, H_kv = 2
    int idx = 0;
    for (const Mask &m : masks)
        for (int keep : {0, 1, 3, 1000}) {
            Problem pb;
            pb.cu = {0, 97, 98, 101, 101, 160};
            pb.causal = m.causal;
            pb.wl = m.wl;
            pb.wr = m.wr;
            pb.key_bias_heads = hbs[idx % 3];
            pb.keep_k = keep;
            pb.fill(4000 + (uint64_t)idx);
            if ((idx + idx / 4) % 2 == 1) pb.quantize_bias(); // ties, for every keep_k
            ++idx;
            const Result single = run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS);
            const GradFloors fl = magnitude_floors(pb);
            for (auto layout : {RINGATTN_LAYOUT_CONTIGUOUS, RINGATTN_LAYOUT_ZIGZAG,
                                RINGATTN_LAYOUT_STRIPED}) {
                INFO("mask " << m.causal << "/" << m.wl << "/" << m.wr << ", H_b "
                             << pb.key_bias_heads << ", keep_k " << keep << ", layout " << layout);
                check_same(ring_over(MPI_COMM_WORLD, pb, layout), single, RINGATTN_FLOAT32, fl);
            }
        }
    // bfloat16, one problem
    Problem pb;
    pb.dtype = RINGATTN_BFLOAT16;
    pb.cu = {0, 80, 131};
    pb.causal = 1;
    pb.wl = 20;
    pb.key_bias_heads = 2;
    pb.keep_k = 6;
    pb.fill(4100);
    const Result single = run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS);
    check_same(ring_over(MPI_COMM_WORLD, pb, RINGATTN_LAYOUT_ZIGZAG), single, RINGATTN_BFLOAT16,
               magnitude_floors(pb));
}

TEST_CASE("ring over MPI: top-k is global, a row's top keys on another rank", "[mpi][dynamic]")
{
    // Causal, keep_k = 5, the five largest biases on tokens 0..4 (rank 0's shard under the
    // contiguous layout): every later row keeps only keys of rank 0. The oracle's output is
    // the reference as well as the single-rank plan.
    Problem pb;
    pb.cu = {0, 150};
    pb.causal = 1;
    pb.key_bias_heads = 1;
    pb.keep_k = 5;
    pb.bias_sigma = 0.5f;
    pb.fill(4200);
    for (int i = 0; i < 5; ++i) pb.bias[(size_t)i] = 2.0f + 0.1f * (float)i;
    const Result single = run(pb, 0, RINGATTN_LAYOUT_CONTIGUOUS);
    const GradFloors fl = magnitude_floors(pb);
    for (auto layout : {RINGATTN_LAYOUT_CONTIGUOUS, RINGATTN_LAYOUT_STRIPED}) {
        INFO("layout " << layout);
        const Result r = ring_over(MPI_COMM_WORLD, pb, layout);
        check_same(r, single, RINGATTN_FLOAT32, fl);
        if (r.status == RINGATTN_SUCCESS) CHECK(o_vs_oracle(pb, r) <= 1e-5);
    }
}

TEST_CASE("a keep_k mismatch fails on every MPI rank", "[mpi][dynamic]")
{
    Problem pb;
    pb.cu = {0, 64};
    pb.key_bias_heads = 1;
    pb.keep_k = 3;
    pb.fill(11);
    const Result r = ring_over(MPI_COMM_WORLD, pb, RINGATTN_LAYOUT_CONTIGUOUS,
                               [](int rank, ringattn_plan_desc_t &d) {
                                   if (rank == 1) d.keep_k = 2;
                               });
    CHECK(r.status == RINGATTN_ERR_INVALID_ARGUMENT);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const int result = Catch::Session().run(argc, argv);
    int worst = 0;
    MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return worst;
}
