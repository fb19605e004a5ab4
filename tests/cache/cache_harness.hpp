// Runs one KV cache problem (ringattn.h: sharded_cache, cu_seqlens_new) through the public API:
// the problem's keys are each sequence's cached keys then its new ones (cfg.cu_k counts both),
// as the float64 oracle sees them; the library gets every query on every rank, each rank's cache
// slots (ringattn_plan_local_keys) in a buffer whose unfilled slots after them are poisoned,
// and the new tokens' K/V apart. Every rank's O and LSE are returned, to be judged and compared.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ring/ring_harness.hpp"

namespace cachetest {

struct CacheLayout {
    std::vector<int32_t> cu_new; // [num_seqs + 1] new tokens per sequence, or empty: none
    std::vector<int32_t> bounds; // cache_bounds [num_seqs * (ranks + 1)], or empty: by layout
    int unfilled = 0;            // poisoned slots after each rank's filled ones (never read)
};

// The cached keys' boundaries of a problem whose cfg.cu_k counts cached and new keys.
std::vector<int32_t> cached_keys(const ratest::AttnConfig &c, const CacheLayout &l);

struct CacheOptions {
    ringtest::RunOptions ring; // its comm (make_comm, nccl); desc_hook
    // Changes a rank's Q (host bytes of [T_q, H, D] in the dtype) before its call.
    std::function<void(int, std::vector<unsigned char> &)> edit_q;
    // P_u > 1: a 2D plan (desc.ulysses_size; groups of consecutive ranks): each rank passes its
    // group's cache slots of only its own kv heads (and key bias heads), as views into the
    // slots of every head; CacheLayout.bounds then has P / P_u + 1 entries per sequence.
    int ulysses = 0;
};

struct CacheResult {
    ringattn_status_t status = RINGATTN_SUCCESS;
    std::vector<ringattn_status_t> rank_status;
    std::vector<std::string> message;          // [ranks]: each rank's failure's message
    std::vector<std::vector<float>> o, lse;    // [ranks]: each rank's whole O and LSE
    std::vector<ringattn_plan_info_t> info;    // [ranks]
    ratest::Got got(const ratest::AttnConfig &c, int rank = 0) const;
};

// ranks = 0: one rank, no comm. Poisoned (NaN) outputs before the call.
CacheResult run_cache(const ratest::Problem &pb, const CacheLayout &l, int ranks,
                      ringattn_layout_t layout, const CacheOptions &opt = CacheOptions());

// This process's part as rank `rank` of comm (an MPI job): entries [rank] of the result.
CacheResult run_cache_rank(const ratest::Problem &pb, const CacheLayout &l, ringattn_comm_t comm,
                           int rank, ringattn_layout_t layout,
                           const CacheOptions &opt = CacheOptions());

} // namespace cachetest
