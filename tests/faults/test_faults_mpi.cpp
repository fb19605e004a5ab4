// The fault scenarios (scenarios.hpp) over MPI, run by ctest under mpirun -n 4: each scenario
// on a fresh comm over MPI_COMM_WORLD, RINGATTN_COMM_TIMEOUT = DEADLINE. Also MPI only: a
// slow but live peer is not an error (the deadline counts time without progress), and, with
// RATEST_FAULT_KILL=1 under mpirun --enable-recovery, a rank killed inside its forward: the
// survivors return RINGATTN_ERR_COMM within the deadline and tear down cleanly.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "faults/scenarios.hpp"
#include "support/alloc_fault.hpp"
#include "support/catch_session.hpp"
#include "ringattn_mpi.h"

using namespace faults;

// An MPI error on demand (finding 4): the library's MPI_Isend resolves to this one (the
// executable exports its symbols), which fails the armed call through the communicator's own
// error handler, as an MPI library does. Under MPI_ERRORS_ARE_FATAL that aborts the job. Only
// K/V messages count (tags below the library's reserved heartbeat and notice tags, 32766+).
static int isend_error_countdown = 0;
extern "C" int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag,
                         MPI_Comm comm, MPI_Request *req)
{
    if (tag < 32766 && isend_error_countdown > 0 && --isend_error_countdown == 0) {
        PMPI_Comm_call_errhandler(comm, MPI_ERR_OTHER);
        return MPI_ERR_OTHER;
    }
    return PMPI_Isend(buf, count, type, dest, tag, comm, req);
}

namespace {

int world_rank()
{
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}

template <class Script> Outcomes on_fresh_comm(Script script)
{
    ringattn_comm_t comm = nullptr;
    REQUIRE(ringattn_comm_create_mpi(MPI_COMM_WORLD, &comm) == RINGATTN_SUCCESS);
    Outcomes outs;
    {
        Rank rank(comm);
        rank.set_sync([] { MPI_Barrier(MPI_COMM_WORLD); });
        const Outcome made = rank.create();
        INFO(made.message);
        REQUIRE(made.status == RINGATTN_SUCCESS);
        outs = script(rank);
    } // the plan goes before the comm
    CHECK(ringattn_comm_destroy(comm) == RINGATTN_SUCCESS);
    MPI_Barrier(MPI_COMM_WORLD); // the next scenario starts together
    return outs;
}

// The survivors of a rank killed inside its forward (RATEST_FAULT_KILL=1).
int kill_run()
{
    const int rank = world_rank();
    ringattn_comm_t comm = nullptr;
    if (ringattn_comm_create_mpi(MPI_COMM_WORLD, &comm) != RINGATTN_SUCCESS) return 1;
    Outcome fwd, destroy;
    {
        Rank r(comm);
        if (r.create().status != RINGATTN_SUCCESS) return 1;
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 3) kill_in_sgemm(3);
        fwd = r.forward(1);
        destroy = r.destroy_plan();
    }
    const ringattn_status_t cd = ringattn_comm_destroy(comm);
    const bool ok = fwd.status == RINGATTN_ERR_COMM && fwd.seconds < DEADLINE + SLACK &&
                    destroy.status == RINGATTN_SUCCESS && cd == RINGATTN_SUCCESS;
    std::printf("rank %d: forward: %s in %.2f s%s: %s\n%s rank %d\n", rank,
                ringattn_status_string(fwd.status), fwd.seconds, fwd.wrong ? " WITH WRONG DATA" : "",
                fwd.message.c_str(), ok ? "SURVIVOR_OK" : "SURVIVOR_BAD", rank);
    std::fflush(stdout);
    return ok ? 0 : 1;
}

} // namespace

TEST_CASE("faults over MPI: no wrong result, no hang, every rank fails the same way",
          "[faults][mpi]")
{
    int ranks = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    REQUIRE(ranks >= 2);
    int level = 0;
    MPI_Query_thread(&level);
    for (const Scenario &s : scenarios()) {
        if (s.hops_threads && level < MPI_THREAD_SERIALIZED) {
            WARN(s.name << ": skipped: MPI gives no MPI_THREAD_SERIALIZED");
            continue;
        }
        SECTION(s.name)
        {
            const int rank = world_rank();
            const Outcomes outs = on_fresh_comm([&](Rank &r) { return s.script(rank, ranks, r); });
            judge_rank(s, rank, outs);
        }
    }
}

TEST_CASE("faults over MPI: plan_create out of memory on one rank after the agreement fails on "
          "every rank", "[faults][mpi][alloc]")
{
    if (!allocfault::available()) {
        WARN("skipped under AddressSanitizer: the allocation interposer would bypass its allocator");
        return;
    }
    const int rank = world_rank();
    const Outcomes outs = on_fresh_comm([&](Rank &r) {
        Outcomes o{create_big_plan(r.comm(), rank == 1)};
        r.sync();
        o.push_back(r.forward(1));
        return o;
    });
    INFO(describe(outs));
    CHECK(outs[0].status == RINGATTN_ERR_OUT_OF_MEMORY);
    CHECK_FALSE(outs[0].wrong);
    CHECK(outs[1].status == RINGATTN_SUCCESS); // the comm still works
    CHECK_FALSE(outs[1].wrong);
}

TEST_CASE("faults over MPI: a slow but live peer is progress, not a timeout", "[faults][mpi]")
{
    // Pieces of 512 bytes (RINGATTN_MPI_CHUNK, set before the comm is made: a shard is 32 of
    // them), and rank 1 slowed in its first ring step to one poll per 0.4 s (the kernels poll
    // after each query tile of 8 cblas_sgemm calls here): moving its shard takes about 3
    // deadlines, but pieces move well within every deadline, and the ranks that wait on rank
    // 2 (which waits on rank 1) hear its heartbeats.
    setenv("RINGATTN_MPI_CHUNK", "512", 1);
    const int rank = world_rank();
    const Outcomes outs = on_fresh_comm([&](Rank &r) {
        if (rank == 1) stall_sgemm(0.05, 64);
        Outcomes o{r.forward(1)};
        stall_sgemm(0, 0);
        o.push_back(r.forward(2));
        return o;
    });
    unsetenv("RINGATTN_MPI_CHUNK");
    INFO(describe(outs));
    for (const Outcome &o : outs) {
        CHECK(o.status == RINGATTN_SUCCESS);
        CHECK_FALSE(o.wrong);
    }
    if (rank != 1) CHECK(outs[0].seconds > 1.5 * DEADLINE); // it was slow
}

TEST_CASE("faults over MPI: an MPI error is a status on every rank, not an abort",
          "[faults][mpi]")
{
    const int rank = world_rank();
    const Outcomes outs = on_fresh_comm([&](Rank &r) {
        if (rank == 1) isend_error_countdown = 2; // a K/V send of its first ring step
        Outcomes o{r.forward(1)};
        isend_error_countdown = 0;
        o.push_back(r.forward(1));
        return o;
    });
    INFO(describe(outs));
    CHECK(outs[0].status == RINGATTN_ERR_COMM);
    CHECK(outs[0].seconds < DEADLINE + SLACK);
    CHECK(outs[1].status == RINGATTN_ERR_COMM); // the comm has failed for good
    if (rank == 1) CHECK(outs[0].message.find("MPI_ERR_OTHER") != std::string::npos);
}

int main(int argc, char **argv)
{
    int provided = 0;
    // a rank's calls on several threads, one at a time (the scenarios that hop threads)
    MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
    setenv("RINGATTN_COMM_TIMEOUT", std::to_string(DEADLINE).c_str(), 1);
    const char *kill = std::getenv("RATEST_FAULT_KILL");
    if (kill && std::string(kill) == "1") {
        const int rc = kill_run();
        // MPI_Finalize would wait for the dead rank: the survivors' part is done
        std::_Exit(rc);
    }
    const int rc = ra_catch_run(argc, argv);
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return worst;
}
