// A custom transport (include/ringattn_transport.h) for the tests: ranks as threads of this
// process, messages copied into a mailbox when sent and out of it when the receiver's request
// is tested, matched by (source, destination, tag) in order, and a barrier allreduce (its own
// deadline: RINGATTN_COMM_TIMEOUT). Each rank's endpoint counts what the library must never do
// (a callback off the rank's thread or two at once, a request used after its release, a
// malformed message) and can inject a failure. test_custom_transport.cpp, the ring catalogue
// (RATEST_TRANSPORT=custom) and the fault tests use it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ring/ring_harness.hpp"
#include "ringattn_transport.h"

namespace mailbox {

constexpr int FAULT = 7; // the code an injected failure returns

struct Message {
    int src, dst, tag;
    std::vector<unsigned char> data;
};

// The ranks' shared state: messages on offer, the allreduce's barrier.
struct Mailbox {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Message> posted;
    int size = 0, arrived = 0;
    unsigned long generation = 0;
    int64_t acc[64] = {}, result[64] = {};
};

struct Request;

// One rank's transport (its `user`), and what the test checks of the library's calls.
struct Endpoint {
    std::shared_ptr<Mailbox> mb;
    int rank = 0;
    std::thread::id owner; // the rank's thread, which made the comm
    bool any_thread = false; // the rank calls from several threads: not checked
    std::atomic<int> inside{0}, wrong_thread{0}, overlapped{0}, stale{0}, bad_message{0};
    std::set<Request *> live;
    int releases = 0, live_at_release = 0, late_writes = 0;
    std::atomic<size_t> bytes_sent{0}; // every message's bytes this rank posted to send
    bool with_alltoall = false;        // offer alltoall_start (ringattn_transport.h, 0.6)
    std::atomic<int> alltoalls{0};     // alltoall_start calls
    std::string error_after_calls; // ringattn_last_error() after the rank's calls
    // Fault: the fail_at-th call (from 0) of callback `fail` (or of test and wait together:
    // "test|wait") returns FAULT.
    std::string fail;
    int fail_at = -1, counted = 0;
    // Pending receives complete at their next test, their bytes written (a late arrival).
    bool deliver_late = false;

    bool inject(const char *callback)
    {
        if (fail.empty() || fail.find(callback) == std::string::npos) return false;
        return counted++ == fail_at;
    }
};

ringattn_transport_t table(Endpoint *ep);

// Comms for the harness (RunOptions.make_comm): a fresh mailbox per run, an endpoint per rank
// kept for the checks; fault_rank's endpoint gets the fault.
struct Network {
    std::mutex mu;
    std::shared_ptr<Mailbox> mb;
    int made_in_run = 0;
    std::vector<std::unique_ptr<Endpoint>> endpoints;
    int fault_rank = -1;
    std::string fail;
    int fail_at = -1;
    bool any_thread = false; // every endpoint's any_thread
    bool with_alltoall = false; // every endpoint's with_alltoall

    ringattn_status_t make(int rank, int ranks, ringattn_comm_t *comm);
    // Rank r's endpoint in a network of one run (its comms were all made by plan creation).
    Endpoint &of(int r);
    ringtest::RunOptions options();
};

} // namespace mailbox
