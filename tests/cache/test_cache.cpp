// Inference against a KV cache (ringattn.h: sharded_cache, cache_bounds, cu_seqlens_new): the
// cache split across P = 1..4 ranks of the threads transport (the device one, or NCCL, on the
// CUDA backend) or held by one rank without a comm, every query on every rank, against the
// float64 oracle of the same keys under SPEC 9, every rank's O and LSE bitwise the same. SPEC 10
// case 1 with whole shards outside the window; random decode and chunked prefill over every mask,
// GQA, softcap, ALiBi, dtype, layout, caller-given slot ranges and dynamic masks (the top-k over
// the whole cache); cached + new K/V against the concatenation; the traffic skipped ranks save;
// bad input refused on every rank.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "cache/cache_cases.hpp"

using namespace cachetest;

TEST_CASE("SPEC 10 case 1 on a sharded cache: whole shards outside the window compute and send "
          "nothing, poisoned slots are never read")
{
    for (ringattn_dtype_t dt : ratest::all_dtypes) {
        const AttnConfig c = chunked_kv_case(dt);
        Problem pb = ratest::packed_problem(c, ratest::seed_for("cache case 1", (uint64_t)dt));
        // keys 0..287 are in the first, entirely masked block (P = 1) or on ranks whose every
        // key is outside the window (P = 2, 3, 4): NaN there must never reach the result
        Problem poisoned = pb;
        for (int64_t j = 0; j < 288; ++j)
            for (int cc = 0; cc < c.D; ++cc) {
                poisoned.k.set(j, 0, cc, NAN);
                poisoned.v.set(j, 0, cc, NAN);
            }
        const ratest::Spec9 judge = forward_judge(pb);
        CacheLayout l;
        l.unfilled = 700 - 576; // after each rank's slots: the unfilled tail of its buffer
        for (int P = 0; P <= 4; ++P) {
            const std::string label = "dtype " + std::to_string(dt) + ", ranks " + std::to_string(P);
            const CacheResult a = run_cache(pb, l, P, RINGATTN_LAYOUT_CONTIGUOUS);
            check_cache(a, judge, pb, label);
            const CacheResult b = run_cache(poisoned, l, P, RINGATTN_LAYOUT_CONTIGUOUS);
            REQUIRE(b.status == RINGATTN_SUCCESS);
            CHECK(ringtest::same_bits(a.o[0], b.o[0]));
            CHECK(ringtest::same_bits(a.lse[0], b.lse[0]));
            if (P < 2) continue;
            // only the last rank's keys meet the query: one partial of 1 x 2 x 32 floats + 2
            // LSEs travels, P - 1 hops; every other rank sends nothing of its own
            const size_t part = (size_t)(1 * 2 * 32 + 2) * sizeof(float);
            for (int r = 0; r < P; ++r) {
                INFO(label << ", rank " << r);
                CHECK(a.info[(size_t)r].forward_bytes_sent == (r == P - 2 ? 0 : part));
                CHECK(a.info[(size_t)r].forward_bytes_received == (r == P - 1 ? 0 : part));
                CHECK(a.info[(size_t)r].compute_steps == (r == P - 1 ? 1 : 0));
            }
        }
    }
}

TEST_CASE("Random decode and chunked prefill against a sharded cache match the float64 oracle "
          "on every rank")
{
    const int cases = ratest::sized(48, 10);
    for (int i = 0; i < cases; ++i) {
        std::mt19937_64 rng(ratest::seed_for("cache random", (uint64_t)i));
        const int ranks = i % 5; // 0: no comm
        const Drawn d = draw(rng, ranks);
        const ringattn_layout_t layout = ringtest::all_layouts[rng() % 3];
        Problem pb = ratest::packed_problem(d.cfg, ratest::seed_for("cache random pb", (uint64_t)i));
        const std::string label = "case " + std::to_string(i) + ", ranks " + std::to_string(ranks) +
                                  ", layout " + std::to_string(layout) +
                                  (d.layout.bounds.empty() ? "" : ", caller's bounds") +
                                  (d.layout.cu_new.empty() ? "" : ", new K/V");
        check_cache(run_cache(pb, d.layout, ranks, layout), forward_judge(pb), pb, label);
    }
}

TEST_CASE("2D plans on a sharded cache: heads split across the group, the cache across groups")
{
    // P = 4 (2 x 2) and 6 (3 x 2, 2 x 3); each rank holds its group's slots of its own kv heads
    const int grids[][2] = {{2, 2}, {3, 2}, {2, 3}};
    for (int i = 0; i < ratest::sized(12, 3); ++i) {
        const int pu = grids[i % 3][0], pr = grids[i % 3][1];
        std::mt19937_64 rng(ratest::seed_for("cache 2d", (uint64_t)i));
        Drawn d = draw(rng, pr); // the caller's bounds, if any, are per group
        d.cfg.H = 6 * pu;        // H_kv split (H_kv = P_u) or replicated (1)
        d.cfg.Hkv = i % 2 ? 1 : pu;
        d.cfg.alibi = d.cfg.alibi.empty() ? d.cfg.alibi : ratest::alibi_slopes(d.cfg.H);
        if (d.cfg.key_bias_heads > 1) d.cfg.key_bias_heads = d.cfg.hkv();
        if (i % 3 == 1) {
            d.cfg.sinks.assign((size_t)d.cfg.H, 0.5);
            d.cfg.sinks[0] = -INFINITY;
        }
        Problem pb = ratest::packed_problem(d.cfg, ratest::seed_for("cache 2d pb", (uint64_t)i));
        CacheOptions opt;
        opt.ulysses = pu;
        check_cache(run_cache(pb, d.layout, pu * pr, ringtest::all_layouts[i % 3], opt),
                    forward_judge(pb), pb,
                    "2D case " + std::to_string(i) + ", " + std::to_string(pu) + " x " +
                        std::to_string(pr) + (d.layout.bounds.empty() ? "" : ", caller's bounds") +
                        (d.layout.cu_new.empty() ? "" : ", new K/V"));
    }
}

TEST_CASE("Attention sinks on a sharded cache: added once, at the merge, on every rank (SPEC 11)")
{
    for (int i = 0; i < 8; ++i) {
        std::mt19937_64 rng(ratest::seed_for("cache sinks", (uint64_t)i));
        const int ranks = i % 4 + (i >= 4); // 0 (no comm), 1, 2, 3 then 2, 3, 4, 1
        Drawn d = draw(rng, ranks);
        std::normal_distribution<double> nd(0.0, 2.0);
        d.cfg.sinks.resize((size_t)d.cfg.H);
        for (double &s : d.cfg.sinks) s = nd(rng);
        if (i % 2) d.cfg.sinks[0] = -INFINITY;
        Problem pb = ratest::packed_problem(d.cfg, ratest::seed_for("cache sinks pb", (uint64_t)i));
        check_cache(run_cache(pb, d.layout, ranks, ringtest::all_layouts[i % 3]), forward_judge(pb),
                    pb, "sinks case " + std::to_string(i) + ", ranks " + std::to_string(ranks));
    }
}

TEST_CASE("A sharded cache over NCCL (CUDA backend: the emulated NCCL in CI)")
{
    if (!on_cuda()) return; // NCCL moves device memory
    CacheOptions opt;
    opt.ring.nccl = true;
    const Problem pb = ratest::packed_problem(chunked_kv_case(RINGATTN_BFLOAT16), 11);
    for (int P : {2, 4})
        check_cache(run_cache(pb, CacheLayout(), P, RINGATTN_LAYOUT_CONTIGUOUS, opt),
                    forward_judge(pb), pb, "SPEC 10 case 1, NCCL, ranks " + std::to_string(P));
    for (int i = 0; i < 4; ++i) {
        std::mt19937_64 rng(ratest::seed_for("cache nccl", (uint64_t)i));
        const Drawn d = draw(rng, 3);
        const Problem rp = ratest::packed_problem(d.cfg, ratest::seed_for("cache nccl pb", (uint64_t)i));
        check_cache(run_cache(rp, d.layout, 3, RINGATTN_LAYOUT_ZIGZAG, opt), forward_judge(rp), rp,
                    "random over NCCL, case " + std::to_string(i));
    }
}

TEST_CASE("Cached + new K/V in one call equals attending the concatenation")
{
    for (ringattn_dtype_t dt : ratest::all_dtypes) {
        AttnConfig c;
        c.H = 4;
        c.Hkv = 2;
        c.D = 32;
        c.dtype = dt;
        c.cu_q = {0, 3, 35};   // a decode step of 3 tokens and a prefill chunk of 32
        c.cu_k = {0, 131, 291}; // caches of 128 and 128, then the queries' own K/V
        c.causal = true;
        c.block_q = 16, c.block_k = 64; // 128 cached keys: the concatenation's tiles end where they do
        Problem pb = ratest::packed_problem(c, ratest::seed_for("cache concat", (uint64_t)dt));
        CacheLayout fresh;
        fresh.cu_new = {0, 3, 35};
        const CacheResult joined = run_cache(pb, fresh, 0, RINGATTN_LAYOUT_CONTIGUOUS);
        check_cache(joined, forward_judge(pb), pb, "cached + new, one rank");
        // the concatenation on a plain single-rank plan: the same tiles in the same order, so
        // the same bits (the state carried between the two key sources in float32)
        ratest::Plan plan(c);
        ratest::require_plan(plan);
        pb.poison_forward_outputs();
        REQUIRE(ratest::run_forward(plan, pb) == RINGATTN_SUCCESS);
        const ratest::Dense concat_o = pb.o.to_dense();
        const ratest::Got got = joined.got(c);
        size_t differ = 0;
        for (size_t i = 0; i < concat_o.v.size(); ++i) differ += got.O.v[i] != concat_o.v[i];
        for (size_t i = 0; i < pb.lse.size(); ++i) differ += (float)got.lse[i] != pb.lse[i];
        CHECK(differ == 0);
        // and sharded over 2 and 3 ranks, the last attending the new K/V
        for (int P : {2, 3})
            check_cache(run_cache(pb, fresh, P, RINGATTN_LAYOUT_CONTIGUOUS), forward_judge(pb), pb,
                        "cached + new, ranks " + std::to_string(P));
    }
}

TEST_CASE("Bad input to a KV cache plan is refused with a message, on every rank")
{
    AttnConfig c = chunked_kv_case(RINGATTN_FLOAT32);
    c.cu_q = {0, 2};
    Problem pb = ratest::packed_problem(c, 77);
    SECTION("queries that differ between ranks: caught by the call's agreement")
    {
        CacheOptions opt;
        opt.edit_q = [](int rank, std::vector<unsigned char> &q) {
            if (rank == 1) q[5] ^= 0x10;
        };
        const CacheResult r = run_cache(pb, CacheLayout(), 3, RINGATTN_LAYOUT_CONTIGUOUS, opt);
        for (size_t k = 0; k < r.rank_status.size(); ++k) {
            CHECK(r.rank_status[k] == RINGATTN_ERR_INVALID_ARGUMENT);
            CHECK(r.message[k].find("q: differs between ranks") != std::string::npos);
        }
    }
    SECTION("slot ranges that differ between ranks: caught by the descriptor's agreement")
    {
        CacheLayout l;
        l.bounds = {0, 300, 576}; // rank 1 says {0, 200, 576}
        CacheOptions opt;
        const int32_t other[] = {0, 200, 576};
        opt.ring.desc_hook = [&](int rank, ringattn_plan_desc_t &d) {
            if (rank == 1) d.cache_bounds = other;
        };
        const CacheResult r = run_cache(pb, l, 2, RINGATTN_LAYOUT_CONTIGUOUS, opt);
        for (size_t k = 0; k < r.rank_status.size(); ++k) {
            CHECK(r.rank_status[k] == RINGATTN_ERR_INVALID_ARGUMENT);
            CHECK(r.message[k].find("desc.cache_bounds: differs between ranks") != std::string::npos);
        }
    }
    SECTION("descriptors")
    {
        ringattn_plan_desc_t d = ratest::make_desc(c);
        ringattn_plan_t plan = nullptr;
        const int32_t bad_new[] = {0, 3, 1};
        d.num_seqs = 1;
        d.cu_seqlens_new = bad_new + 1; // {3, 1}: does not start at 0
        CHECK(ringattn_plan_create(nullptr, &d, &plan) == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(std::string(ringattn_last_error()).find("cu_seqlens_new") != std::string::npos);
        d.cu_seqlens_new = nullptr;
        const int32_t bounds[] = {0, 100}; // one rank: 0 .. its 576 keys expected
        d.sharded_cache = 1;
        d.cache_bounds = bounds;
        CHECK(ringattn_plan_create(nullptr, &d, &plan) == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(std::string(ringattn_last_error()).find("cache_bounds") != std::string::npos);
        d.sharded_cache = 0; // bounds without a sharded cache
        CHECK(ringattn_plan_create(nullptr, &d, &plan) == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(plan == nullptr);
    }
    SECTION("a backward, missing new K/V")
    {
        ringattn_plan_desc_t d = ratest::make_desc(c);
        const int32_t cu_new[] = {0, 2};
        d.cu_seqlens_new = cu_new;
        ringattn_plan_t plan = nullptr;
        REQUIRE(ringattn_plan_create(nullptr, &d, &plan) == RINGATTN_SUCCESS);
        ringattn_tensors_t t = pb.tensors();
        CHECK(ringattn_backward(plan, &t, nullptr) == RINGATTN_ERR_UNSUPPORTED);
        CHECK(std::string(ringattn_last_error()).find("forward only") != std::string::npos);
        t.k_new.data = nullptr; // the new tokens' K is needed
        CHECK(ringattn_forward(plan, &t, nullptr) == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(std::string(ringattn_last_error()).find("k_new") != std::string::npos);
        ringattn_plan_destroy(plan);
    }
}
