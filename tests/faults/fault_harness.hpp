// Fault injection for the ring (issue: faults never give a wrong answer or a hang). One rank's
// view of a small ring problem: it makes its plan, runs forward/backward calls on inputs of a
// given generation (each generation its own random Q, K, V, dO), and judges every call that
// succeeds against the single-rank CPU plan on the same generation's inputs. The plans are of
// the backend under test (support/device.hpp), their tensors in its memory and their calls on
// a stream of the rank's own. Faults are injected by the scenario scripts (skipping calls, NULL
// or destroyed plans, sleeping, calls on other threads) and inside the CPU kernels by a stall
// in cblas_sgemm (stall.cpp).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ringattn.h"
#include "support/device.hpp"

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
    explicit Rank(ringattn_comm_t comm);
    ~Rank();
    Rank(const Rank &) = delete;
    Rank &operator=(const Rank &) = delete;
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
    ringattn_comm_t comm() const { return comm_; }
    // Waits until every rank got here (the runner's barrier: threads, or MPI_Barrier).
    void sync() const
    {
        if (sync_) sync_();
    }
    void set_sync(std::function<void()> f) { sync_ = std::move(f); }

  private:
    void load(uint64_t gen);
    ringattn_tensors_t bind();                     // the tensors in the backend's memory
    void download(std::initializer_list<int> outs); // of the outputs named by index in arrays_
    ringattn_comm_t comm_;
    std::function<void()> sync_;
    ringattn_plan_t plan_ = nullptr;
    void *stream_ = nullptr; // a device backend's calls: a stream of this rank's own
    uint64_t forward_gen_ = 0;
    std::vector<int32_t> idx_;
    ratest::Mirrored<float> arrays_[9]; // q, k, v, o, lse, dout, dq, dk, dv
};

// A thread of its own that runs one task at a time for the caller, who waits for it: a rank's
// calls on several threads (PyTorch's autograd runs the backward on a thread of its own).
class Worker {
  public:
    Worker();
    ~Worker();
    Worker(const Worker &) = delete;
    Worker &operator=(const Worker &) = delete;
    Outcome run(const std::function<Outcome()> &task);

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::function<void()> task_;
    bool quit_ = false;
    std::thread thread_;
};

// Issue 28, finding 6: a plan over BIG_T tokens made on comm, with this rank's allocations of
// 512 KiB or more failing when out_of_memory (support/alloc_fault.hpp): its buffers, after the
// agreement. The plan, if made, is destroyed; the outcome says whether one was handed out
// (`wrong`: a plan came back from a failed call, or none from a successful one).
constexpr int BIG_T = 1 << 15;
Outcome create_big_plan(ringattn_comm_t comm, bool out_of_memory);

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
