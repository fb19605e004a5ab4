// The fault scenarios, shared by the threads test (ranks as threads) and the MPI test (ranks
// as processes): each is a script every rank runs on its own Rank, and a judgement of what the
// ranks' calls returned. DEADLINE is RINGATTN_COMM_TIMEOUT in these tests.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "faults/fault_harness.hpp"

namespace faults {

constexpr double DEADLINE = 1.0;
constexpr double SLACK = 1.0; // one ring step and the scheduler of an oversubscribed machine

using Outcomes = std::vector<Outcome>;

struct Scenario {
    std::string name;
    // Runs on each rank after its plan was made; returns its calls' outcomes.
    std::function<Outcomes(int rank, int ranks, Rank &r)> script;
    // Judges one rank's outcomes (Catch2 CHECKs); every scenario also requires that no call
    // succeeded with wrong data.
    std::function<void(int rank, const Outcomes &outs)> judge;
    // It stalls the CPU kernels' cblas_sgemm (stall.cpp): the CPU backend only.
    bool stalls_sgemm = false;
    // It calls from threads other than the rank's own (MPI: MPI_THREAD_SERIALIZED at least).
    bool hops_threads = false;
    // Some rank's deadline is part of it: its peers must hear of the failed comm at once
    // (a custom transport has no way to tell them: DESIGN, failure semantics).
    bool times_out = false;
};

// The catalogue (scenarios.cpp). The faulty rank is rank 1.
const std::vector<Scenario> &scenarios();

// Catch2 checks every scenario shares: no wrong data, and the judge.
void judge_rank(const Scenario &s, int rank, const Outcomes &outs);

} // namespace faults
