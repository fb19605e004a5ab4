// The KV cache tests' cases and judgement, shared by the threads/CUDA tests (test_cache.cpp)
// and the MPI ones (tests/mpi/test_cache_mpi.cpp). Header-only; Catch2 assertions.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>

#include "cache/cache_harness.hpp"
#include "ring/ring_check.hpp"
#include "support/cases.hpp"
#include "support/device.hpp"

namespace cachetest {

using ratest::AttnConfig;
using ratest::Problem;

using ratest::on_cuda;

// r succeeded on every rank, each rank's O and LSE bitwise rank 0's, and rank 0's within SPEC 9.
inline void check_cache(const CacheResult &r, const ratest::Spec9 &judge, const Problem &pb,
                 const std::string &label)
{
    INFO(label << ": " << pb.cfg.describe());
    REQUIRE(r.status == RINGATTN_SUCCESS);
    for (size_t k = 1; k < r.o.size(); ++k) {
        INFO("rank " << k << " against rank 0");
        CHECK(ringtest::same_bits(r.o[k], r.o[0]));
        CHECK(ringtest::same_bits(r.lse[k], r.lse[0]));
    }
    ratest::Spec9Options opt;
    opt.backward = false;
    opt.label = label;
    judge.check(r.got(pb.cfg), opt);
}

inline ratest::Spec9 forward_judge(const Problem &pb)
{
    return ratest::Spec9(pb.cfg, pb.q.to_dense(), pb.k.to_dense(), pb.v.to_dense(),
                         pb.dout.to_dense(), false);
}

// SPEC 10 case 1: 576 of 700 slots filled, one query at 575, window (59, 0), key blocks of 512.
inline AttnConfig chunked_kv_case(ringattn_dtype_t dt)
{
    AttnConfig c;
    c.H = 2;
    c.Hkv = 1;
    c.D = 32;
    c.dtype = dt;
    c.cu_q = {0, 1};
    c.cu_k = {0, 576};
    c.causal = true;
    c.wl = 59;
    c.block_q = 64, c.block_k = 512; // the CPU backend's (the CUDA kernels take their own)
    return c;
}

// A random decode (1..4 queries per sequence) or chunked prefill (a chunk of 9..40) batch
// against caches of 0..300 keys, with new tokens' K/V (the queries' own, as a decode step has)
// half of the time.
struct Drawn {
    AttnConfig cfg;
    CacheLayout layout;
};

inline Drawn draw(std::mt19937_64 &rng, int ranks)
{
    Drawn d;
    AttnConfig &c = d.cfg;
    const bool prefill = rng() % 3 == 0, fresh = rng() % 2 == 0;
    const int nseq = 1 + (int)(rng() % 3);
    c.H = ratest::pick(rng, {2, 4});
    c.Hkv = ratest::pick(rng, {1, 2});
    c.D = ratest::pick(rng, {16, 32, 40});
    c.Dv = rng() % 4 == 0 ? 24 : 0;
    c.dtype = ratest::all_dtypes[rng() % 3];
    std::vector<int> lq, lk, ln;
    for (int s = 0; s < nseq; ++s) {
        const int q = prefill ? 9 + (int)(rng() % 32) : 1 + (int)(rng() % 4);
        const int cached = rng() % 8 == 0 ? 0 : (int)(rng() % 301);
        lq.push_back(q);
        ln.push_back(fresh ? q : 0);
        lk.push_back(cached + (fresh ? q : 0));
    }
    c.cu_q = ratest::cu_from_lengths(lq);
    c.cu_k = ratest::cu_from_lengths(lk);
    if (fresh) d.layout.cu_new = ratest::cu_from_lengths(ln);
    static const ratest::Mask masks[] = {{"none", 0, -1, -1},         {"causal", 1, -1, -1},
                                         {"sliding window", 1, 40, 0}, {"narrow window", 1, 3, 0},
                                         {"band", 0, 20, 5}};
    ratest::apply(c, masks[rng() % 5]);
    ratest::set_random_logit_options(c, rng);
    if (rng() % 4 == 0) { // dynamic masks: the selection over the whole cache
        c.key_bias_heads = ratest::pick(rng, {1, c.hkv()});
        c.keep_k = rng() % 2 ? 0 : ratest::pick(rng, {5, 30});
    }
    c.block_q = ratest::pick(rng, {8, 16, 64}), c.block_k = ratest::pick(rng, {16, 24, 64});
    if (ranks > 0 && rng() % 3 == 0) { // slot ranges of the caller's: appended rank by rank
        const std::vector<int32_t> cu_cache = cachetest::cached_keys(c, d.layout);
        for (int s = 0; s < nseq; ++s) {
            const int32_t len = cu_cache[(size_t)s + 1] - cu_cache[(size_t)s];
            std::vector<int32_t> cut{0, len};
            for (int r = 1; r < ranks; ++r) cut.push_back((int32_t)(rng() % (uint64_t)(len + 1)));
            std::sort(cut.begin(), cut.end());
            d.layout.bounds.insert(d.layout.bounds.end(), cut.begin(), cut.end());
        }
    }
    return d;
}

} // namespace cachetest
