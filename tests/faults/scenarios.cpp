#include "faults/scenarios.hpp"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <thread>

namespace faults {

namespace {

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

bool mentions(const Outcome &o, const char *text) { return o.message.find(text) != std::string::npos; }

// A comm error, within the deadline and one step of the call's start.
void check_comm_failure(const Outcome &o, double within)
{
    INFO(o.what << ": " << o.message);
    CHECK(o.status == RINGATTN_ERR_COMM);
    CHECK(o.seconds < within);
}

// After a comm failure every later call fails at once, saying to recreate the comm.
void check_failed_fast(const Outcome &o)
{
    INFO(o.what << ": " << o.message);
    CHECK(o.status == RINGATTN_ERR_COMM);
    CHECK(o.seconds < 0.5);
    CHECK(mentions(o, "create a new comm"));
}

void check_ok(const Outcome &o)
{
    INFO(o.what << ": " << o.message);
    CHECK(o.status == RINGATTN_SUCCESS);
}

// Rank 1's NULL plan was refused (o[0]); every rank's next call (o[rank == 1 ? 1 : 0]) is
// refused at once for the call that never ran, and the calls after it pair up.
void check_null_plan_then_paired(int rank, const Outcomes &o)
{
    if (rank == 1) CHECK(o[0].status == RINGATTN_ERR_INVALID_ARGUMENT);
    const Outcome &paired = o[rank == 1 ? 1 : 0];
    INFO(paired.message);
    CHECK(paired.status == RINGATTN_ERR_INVALID_USAGE);
    CHECK(paired.seconds < SLACK);
    for (size_t i = (size_t)(rank == 1 ? 2 : 1); i < o.size(); ++i) check_ok(o[i]);
}

std::vector<Scenario> make()
{
    std::vector<Scenario> s;
    // Finding 1: the refused call's peers must not pair with the refused rank's next call.
    s.push_back({"a NULL plan on one rank, then a call with new inputs",
                 [](int rank, int, Rank &r) {
                     Outcomes o;
                     if (rank == 1) o.push_back(r.forward(1, nullptr));
                     o.push_back(r.forward(rank == 1 ? 2 : 1));
                     o.push_back(r.forward(3)); // every rank's retry pairs up
                     return o;
                 },
                 check_null_plan_then_paired});
    s.push_back({"a destroyed plan on one rank, that rank then silent",
                 [](int rank, int, Rank &r) {
                     Outcomes o;
                     if (rank == 1) {
                         ringattn_plan_t dead = r.plan();
                         o.push_back(r.destroy_plan());
                         o.push_back(r.forward(1, dead));
                         sleep_s(DEADLINE + SLACK);
                         o.push_back(r.create()); // the comm has failed meanwhile
                         return o;
                     }
                     o.push_back(r.forward(1));
                     o.push_back(r.forward(1)); // a retry
                     return o;
                 },
                 [](int rank, const Outcomes &o) {
                     if (rank == 1) {
                         CHECK(o[1].status == RINGATTN_ERR_INVALID_USAGE);
                         check_failed_fast(o[2]);
                         return;
                     }
                     check_comm_failure(o[0], DEADLINE + SLACK);
                     check_failed_fast(o[1]);
                 },
                 false, false, true});
    // Finding 2 and 3: a rank late past the deadline; the others fail at the deadline, the
    // late one at once, and retries fail the same way everywhere.
    s.push_back({"a rank that sleeps past the deadline before forward",
                 [](int rank, int, Rank &r) {
                     Outcomes o;
                     if (rank == 1) sleep_s(2.5 * DEADLINE);
                     o.push_back(r.forward(1));
                     o.push_back(r.forward(1));
                     return o;
                 },
                 [](int rank, const Outcomes &o) {
                     if (rank == 1) check_failed_fast(o[0]);
                     else check_comm_failure(o[0], DEADLINE + SLACK);
                     check_failed_fast(o[1]);
                 },
                 false, false, true});
    s.push_back({"a rank that skips the forward and calls backward",
                 [](int rank, int, Rank &r) {
                     Outcomes o;
                     o.push_back(rank == 1 ? r.backward(1) : r.forward(1));
                     o.push_back(r.forward(2));
                     return o;
                 },
                 [](int, const Outcomes &o) {
                     INFO(o[0].message);
                     CHECK(o[0].status == RINGATTN_ERR_INVALID_USAGE);
                     CHECK(o[0].seconds < SLACK);
                     check_ok(o[1]);
                 }});
    s.push_back({"a rank that skips the call and stays away",
                 [](int rank, int, Rank &r) {
                     Outcomes o;
                     if (rank != 1) o.push_back(r.forward(1));
                     else sleep_s(DEADLINE + SLACK);
                     o.push_back(r.forward(2));
                     return o;
                 },
                 [](int rank, const Outcomes &o) {
                     if (rank != 1) check_comm_failure(o[0], DEADLINE + SLACK);
                     check_failed_fast(o.back());
                 },
                 false, false, true});
    s.push_back({"an invalid comm passed to plan_create on one rank",
                 [](int rank, int, Rank &r) {
                     Outcomes o;
                     r.destroy_plan();
                     int junk = 0;
                     o.push_back(rank == 1 ? r.create(reinterpret_cast<ringattn_comm_t>(&junk))
                                           : r.create());
                     return o;
                 },
                 [](int rank, const Outcomes &o) {
                     if (rank == 1) CHECK(o[0].status == RINGATTN_ERR_INVALID_USAGE);
                     else check_comm_failure(o[0], DEADLINE + SLACK);
                 },
                 false, false, true});
    s.push_back({"a rank that stalls inside the kernel past the deadline",
                 [](int rank, int, Rank &r) {
                     Outcomes o;
                     if (rank == 1) stall_sgemm(2.5 * DEADLINE, 1);
                     o.push_back(r.forward(1));
                     stall_sgemm(0, 0);
                     o.push_back(r.forward(1));
                     return o;
                 },
                 [](int rank, const Outcomes &o) {
                     check_comm_failure(o[0], (rank == 1 ? 2.5 * DEADLINE : DEADLINE) + SLACK);
                     check_failed_fast(o[1]);
                     // the message names who waited for whom, at which step of which call;
                     // on a 2D plan (RATEST_ULYSSES) the group waits in its agreement after
                     // the inner ring, which names the deadline alone
                     INFO(o[0].message);
                     if (std::getenv("RATEST_ULYSSES")) {
                         CHECK((mentions(o[0], "no progress for") ||
                                mentions(o[0], "no answer from some rank for")));
                         return;
                     }
                     CHECK(mentions(o[0], "no progress for"));
                     CHECK(mentions(o[0], "ring step"));
                     CHECK(mentions(o[0], "of call"));
                 },
                 true, false, true});
    s.push_back({"forward then backward with a NULL plan on one rank",
                 [](int rank, int, Rank &r) {
                     Outcomes o;
                     o.push_back(r.forward(1));
                     o.push_back(rank == 1 ? r.forward(1, nullptr) : r.backward(1));
                     if (rank == 1) o.push_back(r.backward(1)); // the late backward: refused
                     o.push_back(r.forward(2));
                     o.push_back(r.backward(2));
                     return o;
                 },
                 [](int rank, const Outcomes &o) {
                     check_ok(o[0]);
                     INFO(o[rank == 1 ? 2 : 1].message);
                     CHECK(o[rank == 1 ? 2 : 1].status == RINGATTN_ERR_INVALID_USAGE);
                     check_ok(o[o.size() - 2]);
                     check_ok(o.back());
                 }});
    // Issue 28, findings 1 and 2: a refusal belongs to no thread. Each rank's calls run on two
    // threads of its own (a forward thread and a backward thread, as PyTorch's autograd runs
    // them), neither of them the thread that made the plan.
    s.push_back({"a NULL plan on one thread, then a call with new inputs on another",
                 [](int rank, int, Rank &r) {
                     Worker a, b;
                     Outcomes o;
                     if (rank == 1) o.push_back(a.run([&] { return r.forward(1, nullptr); }));
                     o.push_back(b.run([&] { return r.forward(rank == 1 ? 2 : 1); }));
                     o.push_back(a.run([&] { return r.forward(3); })); // pairs up again
                     o.push_back(b.run([&] { return r.forward(4); }));
                     return o;
                 },
                 check_null_plan_then_paired, false, true});
    s.push_back({"forward and backward on their own threads, after a refusal on the forward's",
                 [](int rank, int, Rank &r) {
                     Worker fwd, bwd;
                     Outcomes o;
                     if (rank == 1) o.push_back(fwd.run([&] { return r.forward(1, nullptr); }));
                     o.push_back(fwd.run([&] { return r.forward(1); })); // fails with the refusal
                     for (uint64_t gen = 2; gen <= 4; ++gen) {
                         o.push_back(fwd.run([&] { return r.forward(gen); }));
                         o.push_back(bwd.run([&] { return r.backward(gen); }));
                     }
                     return o;
                 },
                 [](int rank, const Outcomes &o) {
                     const size_t first = rank == 1 ? 1 : 0;
                     INFO(o[first].message);
                     CHECK(o[first].status == RINGATTN_ERR_INVALID_USAGE);
                     for (size_t i = first + 1; i < o.size(); ++i) check_ok(o[i]);
                 },
                 false, true});
    return s;
}

} // namespace

const std::vector<Scenario> &scenarios()
{
    static const std::vector<Scenario> all = make();
    return all;
}

void judge_rank(const Scenario &s, int rank, const Outcomes &outs)
{
    INFO("scenario: " << s.name << ", rank " << rank << ":\n" << describe(outs));
    for (const Outcome &o : outs) {
        INFO(o.what << ": " << o.message);
        CHECK_FALSE(o.wrong);
        CHECK_FALSE(mentions(o, "rank -1")); // a message names the peer it waited for
    }
    s.judge(rank, outs);
}

} // namespace faults
