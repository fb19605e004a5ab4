// ringattn_comm_create_nccl_mpi (include/ringattn_mpi.h) under mpirun -n 2, against the emulated
// library (build/emu: the CUDA backend over the SIMT emulation, NCCL over the fake one, whose
// ranks are threads of one process, so two MPI processes never join one fake communicator):
// bad arguments on one rank fail every rank at once, before any NCCL call; a communicator
// whose ranks never all join is RINGATTN_ERR_COMM on every rank within the deadline; on each
// rank's own one-rank communicator the helper's NCCL comm runs a CUDA plan, within SPEC 9 of the
// oracle. Against a library without NCCL every call is RINGATTN_ERR_UNSUPPORTED, said so.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <chrono>
#include <cstring>
#include <string>

#include "ring/ring_check.hpp"
#include "ringattn_mpi.h"
#include "support/cases.hpp"

namespace {

int world_rank()
{
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

// The library under test has the NCCL transport (the emulated one; a CUDA build with NCCL).
bool library_has_nccl()
{
    ringattn_comm_t c = nullptr;
    const ringattn_status_t st = ringattn_comm_create_nccl_mpi(MPI_COMM_SELF, -7, &c);
    return st != RINGATTN_ERR_UNSUPPORTED;
}

} // namespace

TEST_CASE("without NCCL the helper says so on every rank", "[mpi][nccl]")
{
    if (library_has_nccl()) return;
    ringattn_comm_t c = nullptr;
    CHECK(ringattn_comm_create_nccl_mpi(MPI_COMM_WORLD, 0, &c) == RINGATTN_ERR_UNSUPPORTED);
    CHECK(std::strstr(ringattn_last_error(), "no NCCL transport") != nullptr);
    CHECK(c == nullptr);
}

TEST_CASE("bad arguments on one rank fail every rank at once", "[mpi][nccl]")
{
    if (!library_has_nccl()) return;
    const int rank = world_rank();
    ringattn_comm_t c = nullptr;
    CHECK(ringattn_comm_create_nccl_mpi(MPI_COMM_NULL, 0, &c) == RINGATTN_ERR_INVALID_ARGUMENT);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(ringattn_comm_create_nccl_mpi(MPI_COMM_WORLD, rank == 1 ? -5 : -1, &c) ==
          RINGATTN_ERR_INVALID_ARGUMENT);
    INFO(ringattn_last_error());
    CHECK(std::strstr(ringattn_last_error(), rank == 1 ? "bad device" : "another rank") != nullptr);
    CHECK(ringattn_comm_create_nccl_mpi(MPI_COMM_WORLD, -1, rank == 0 ? nullptr : &c) ==
          RINGATTN_ERR_INVALID_ARGUMENT);
    // a device this rank does not have (the emulation has two): at once, not at the deadline
    CHECK(ringattn_comm_create_nccl_mpi(MPI_COMM_WORLD, rank == 0 ? 1000 : 0, &c) ==
          RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(c == nullptr);
    CHECK(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
}

TEST_CASE("ranks that never all join are RINGATTN_ERR_COMM within the deadline", "[mpi][nccl]")
{
    if (!library_has_nccl()) return;
    ringattn_comm_t c = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(ringattn_comm_create_nccl_mpi(MPI_COMM_WORLD, -1, &c) == RINGATTN_ERR_COMM);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    INFO(ringattn_last_error());
    CHECK(std::strstr(ringattn_last_error(), "not every rank joined") != nullptr);
    CHECK(s < 2.0 + 3.0); // RINGATTN_COMM_TIMEOUT=2 (ctest), and slack for a loaded machine
    CHECK(c == nullptr);
}

TEST_CASE("the helper's comm on one rank runs a CUDA plan within SPEC 9", "[mpi][nccl]")
{
    if (!library_has_nccl()) return;
    ringattn_comm_t c = nullptr;
    REQUIRE(ringattn_comm_create_nccl_mpi(MPI_COMM_SELF, -1, &c) == RINGATTN_SUCCESS);
    const ratest::Problem pb =
        ratest::packed_problem(ratest::ring_batch({"causal+window", 1, 30, -1}), 21);
    const ringtest::Result r = ringtest::run_rank(pb, c, 0, RINGATTN_LAYOUT_ZIGZAG);
    ringattn_comm_destroy(c);
    ringtest::check_result(r, ringtest::judge_of(pb), pb, "one-rank NCCL comm from MPI");
}
