// Fault injection for the ring (issue: faults never give a wrong answer or a hang). One rank's
// view of a small ring problem: it makes its plan, runs forward/backward calls on inputs of a
// given generation (each generation its own random Q, K, V, dO), and judges every call that
// succeeds against the single-rank plan on the same generation's inputs. Faults are injected
// by the scenario scripts (skipping calls, NULL or destroyed plans, sleeping) and inside the
// kernels by a stall in cblas_sgemm (stall.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ringattn.h"

namespace faults {

constexpr int T = 256, H = 2, D = 16; // global tokens, heads, head dim (float32)

// What one call did.
struct Outcome {
    std::string what;
    ringattn_status_t status = RINGATTN_ERR_INTERNAL;
    double seconds = 0;
    bool wrong = false; // succeeded with outputs that differ from the single-rank result
    std::string message;
};

ringattn_plan_desc_t problem_desc();

class Rank {
  public:
    explicit Rank(ringattn_comm_t comm) : comm_(comm) {}
    ~Rank();
    Outcome create(ringattn_comm_t comm_to_pass);
    Outcome create() { return create(comm_); }
    // plan_to_pass: the plan handed to the library (this rank's own unless a test passes
    // NULL or a destroyed one).
    Outcome forward(uint64_t gen, ringattn_plan_t plan_to_pass);
    Outcome forward(uint64_t gen) { return forward(gen, plan_); }
    // After forward(gen) on this rank it uses that forward's O and LSE (else zeros).
    Outcome backward(uint64_t gen);
    Outcome destroy_plan();
    ringattn_plan_t plan() const { return plan_; }

  private:
    void load(uint64_t gen);
    ringattn_comm_t comm_;
    ringattn_plan_t plan_ = nullptr;
    uint64_t forward_gen_ = 0;
    std::vector<int32_t> idx_;
    std::vector<float> q_, k_, v_, dout_, o_, lse_, dq_, dk_, dv_;
};

// The outputs of the single-rank plan for a generation, global rows (cached, thread safe).
struct Reference {
    std::vector<float> o, dq, dk, dv;
};
const Reference &reference(uint64_t gen);

// Stalls the calling thread's next `calls` cblas_sgemm calls by `seconds` each (stall.cpp);
// kill_at > 0: the kill_at-th call from now raises SIGKILL instead.
void stall_sgemm(double seconds, int calls);
void kill_in_sgemm(int kill_at);

// A one-line account of a rank's outcomes, for failure messages.
std::string describe(const std::vector<Outcome> &outs);

double now_s();

} // namespace faults
