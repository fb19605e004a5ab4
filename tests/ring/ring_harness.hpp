// Runs one ring-attention problem on P ranks and on one rank, through the public API only, and
// gathers the ranks' local outputs back into global order (ringattn_plan_local_tokens). The
// single-rank plan is itself checked against the float64 oracle by the unit tests, so ring ==
// single-rank within SPEC 9 means ring == oracle.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ringattn.h"

namespace ringtest {

struct Problem {
    int H = 4, Hkv = 2, D = 32, Dv = 32;
    ringattn_dtype_t dtype = RINGATTN_FLOAT32;
    std::vector<int32_t> cu; // global cu_seqlens
    int causal = 0, wl = -1, wr = -1;
    float softcap = 0.0f;
    std::vector<float> alibi;
    // Dynamic mask attention (SPEC 6): key_bias_heads = H_b (0: none), keep_k, and the global
    // bias [H_b, T] (float32; fill() draws it from N(0, bias_sigma) when H_b > 0, after every
    // other input, and a test may overwrite it afterwards). Each rank is given the bias columns
    // of its own tokens, [H_b, T_local], in local token order, like its K rows.
    int key_bias_heads = 0, keep_k = 0;
    float bias_sigma = 1.0f;
    bool want_dbias = true; // false: tensors.dbias = NULL on every rank; Result.dbias stays empty
    std::vector<float> bias;
    // Bad-argument tests: when set, every rank first calls ringattn_forward with its tensors as
    // edited here (rank, tensors), records the status in Result.edited_status[rank], and then
    // runs the forward and backward with its real tensors on the same plan.
    std::function<void(int, ringattn_tensors_t &)> edit_first_call;
    // Global inputs, stored in the problem's dtype (raw elements), packed.
    std::vector<uint16_t> q16, k16, v16, do16;
    std::vector<float> q32, k32, v32, do32;
    int64_t T() const { return cu.back(); }
    ringattn_plan_desc_t desc(ringattn_layout_t layout) const;
    void fill(uint64_t seed);
    // Round the bias to multiples of 1/2: exact ties, within and across shards.
    void quantize_bias();
};

// Outputs in global order, as float (converted from the dtype).
struct Result {
    std::vector<float> o, lse, dq, dk, dv;
    std::vector<float> dbias; // [H_b, T], empty without a bias
    ringattn_status_t status = RINGATTN_SUCCESS;
    std::vector<ringattn_status_t> edited_status; // [ranks], with Problem.edit_first_call
};

// One rank's work given its comm (nullptr: single rank); run on `ranks` threads. The hook, when
// set, may change each rank's descriptor before plan creation (mismatch tests).
Result run(const Problem &pb, int ranks, ringattn_layout_t layout,
           const std::function<void(int, ringattn_plan_desc_t &)> &hook = {});

// This process's part as rank `rank` of comm (an MPI job, say): the global result with only
// this rank's tokens filled in and every other entry 0, so that summing the ranks' results
// (an allreduce) gives the global result exactly.
Result run_rank(const Problem &pb, ringattn_comm_t comm, int rank, ringattn_layout_t layout,
                const std::function<void(int, ringattn_plan_desc_t &)> &hook = {});

} // namespace ringtest
