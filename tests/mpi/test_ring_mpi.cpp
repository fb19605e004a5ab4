// The ring over MPI (run by ctest under mpirun -n 2, 3 and 4): every rank's outputs are summed
// into the global result (an allreduce of exact zeros elsewhere) and compared, on every rank,
// with the single-rank plan within SPEC 9, for every layout and mask; a sub-communicator; a
// descriptor mismatch failing on every rank within seconds.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <mpi.h>

#include <chrono>

#include "ring/compare.hpp"
#include "ring/ring_harness.hpp"
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
    for (auto *v : {&r.o, &r.lse, &r.dq, &r.dk, &r.dv}) allreduce_sum(*v, mpi);
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

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const int result = Catch::Session().run(argc, argv);
    int worst = 0;
    MPI_Allreduce(&result, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return worst;
}
