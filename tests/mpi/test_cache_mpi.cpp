// A sharded KV cache over MPI (run by ctest under mpirun -n 2, 3 and 4): every rank attends
// every query to its own cache slots and gets the whole O and LSE, judged on every rank against
// the float64 oracle under SPEC 9 and compared bit for bit with rank 0's (broadcast); SPEC 10
// case 1 with whole shards outside the window; random decode and chunked prefill (masks, GQA,
// softcap, ALiBi, dtypes, layouts, the caller's slot ranges, new K/V, dynamic masks); queries
// that differ on one rank refused on every rank.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <string>

#include "cache/cache_cases.hpp"
#include "ringattn_mpi.h"

using namespace cachetest;

namespace {

struct World {
    int rank = 0, size = 1;
    ringattn_comm_t comm = nullptr;
    World()
    {
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        REQUIRE(ringattn_comm_create_mpi(MPI_COMM_WORLD, &comm) == RINGATTN_SUCCESS);
    }
    ~World() { ringattn_comm_destroy(comm); }
};

// This rank's result: succeeded, within SPEC 9, and bitwise rank 0's.
void check_here(const World &w, const CacheResult &mine, const Problem &pb, const std::string &label)
{
    CacheResult r = mine;
    r.o[0] = mine.o[(size_t)w.rank];
    r.lse[0] = mine.lse[(size_t)w.rank];
    r.o.resize(1);
    r.lse.resize(1);
    int ok = r.status == RINGATTN_SUCCESS, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    INFO(label << " on rank " << w.rank << ": " << ringattn_last_error());
    REQUIRE(all == 1);
    std::vector<float> o0 = r.o[0], lse0 = r.lse[0];
    MPI_Bcast(o0.data(), (int)o0.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
    MPI_Bcast(lse0.data(), (int)lse0.size(), MPI_FLOAT, 0, MPI_COMM_WORLD);
    CHECK(ringtest::same_bits(r.o[0], o0));
    CHECK(ringtest::same_bits(r.lse[0], lse0));
    check_cache(r, forward_judge(pb), pb, label);
}

} // namespace

TEST_CASE("SPEC 10 case 1 on a cache sharded over MPI", "[mpi][cache]")
{
    World w;
    CacheLayout l;
    l.unfilled = 700 - 576;
    for (ringattn_dtype_t dt : ratest::all_dtypes) {
        const Problem pb = ratest::packed_problem(chunked_kv_case(dt), 100 + (uint64_t)dt);
        const CacheResult r = run_cache_rank(pb, l, w.comm, w.rank, RINGATTN_LAYOUT_CONTIGUOUS);
        check_here(w, r, pb, "SPEC 10 case 1, dtype " + std::to_string(dt));
        const size_t part = (size_t)(1 * 2 * 32 + 2) * sizeof(float);
        CHECK(r.info[(size_t)w.rank].forward_bytes_sent == (w.rank == w.size - 2 ? 0 : part));
    }
}

TEST_CASE("Random decode and chunked prefill against a cache sharded over MPI", "[mpi][cache]")
{
    World w;
    for (int i = 0; i < 16; ++i) {
        std::mt19937_64 rng(ratest::seed_for("cache mpi", (uint64_t)i));
        const Drawn d = draw(rng, w.size);
        const ringattn_layout_t layout = ringtest::all_layouts[rng() % 3];
        const Problem pb = ratest::packed_problem(d.cfg, ratest::seed_for("cache mpi pb", (uint64_t)i));
        check_here(w, run_cache_rank(pb, d.layout, w.comm, w.rank, layout), pb,
                   "case " + std::to_string(i) + ", layout " + std::to_string(layout));
    }
}

TEST_CASE("2D plans on a cache sharded over MPI: heads across groups of 2", "[mpi][cache]")
{
    World w;
    if (w.size % 2) return; // groups of 2 consecutive ranks
    for (int i = 0; i < 6; ++i) {
        std::mt19937_64 rng(ratest::seed_for("cache mpi 2d", (uint64_t)i));
        Drawn d = draw(rng, w.size / 2); // the caller's bounds, if any, per group
        d.cfg.H = 4;
        d.cfg.Hkv = i % 2 ? 1 : 2; // replicated, or split
        if (!d.cfg.alibi.empty()) d.cfg.alibi = ratest::alibi_slopes(d.cfg.H);
        if (d.cfg.key_bias_heads > 1) d.cfg.key_bias_heads = d.cfg.hkv();
        const Problem pb = ratest::packed_problem(d.cfg, ratest::seed_for("cache mpi 2d pb", (uint64_t)i));
        CacheOptions opt;
        opt.ulysses = 2;
        check_here(w, run_cache_rank(pb, d.layout, w.comm, w.rank, ringtest::all_layouts[i % 3], opt),
                   pb, "2D case " + std::to_string(i));
    }
}

TEST_CASE("Queries that differ on one MPI rank are refused on every rank", "[mpi][cache]")
{
    World w;
    const Problem pb = ratest::packed_problem(chunked_kv_case(RINGATTN_FLOAT32), 7);
    CacheOptions opt;
    opt.edit_q = [&](int rank, std::vector<unsigned char> &q) {
        if (rank == w.size - 1) q[0] ^= 1;
    };
    const CacheResult r = run_cache_rank(pb, CacheLayout(), w.comm, w.rank,
                                         RINGATTN_LAYOUT_CONTIGUOUS, opt);
    CHECK(r.status == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(r.message[(size_t)w.rank].find("q: differs between ranks") != std::string::npos);
    // the comm stays usable: the next call pairs up again
    check_here(w, run_cache_rank(pb, CacheLayout(), w.comm, w.rank, RINGATTN_LAYOUT_CONTIGUOUS),
               pb, "after the refusal");
}
