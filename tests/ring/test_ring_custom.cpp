// The ring over a custom transport (include/ringattn_transport.h) written here: ranks as threads,
// messages copied into a mailbox when sent and out of it when the receiver's request is tested,
// matched by (source, destination, tag) in order, and a barrier allreduce. P = 1, 2, 3 within
// SPEC 9 of the float64 oracle on every layout, with a key bias and top-k (the allgather) and
// the backward's two-slot exchanges; every callback on its rank's thread (OpenMP teams of two),
// never two at once, never on a request the transport has released. A callback that fails
// mid-ring fails every rank with RINGATTN_ERR_COMM within about the deadline, and the requests
// the library gave up are tested until done before their buffers go. Bad tables are refused.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "ring/ring_check.hpp"
#include "ringattn_transport.h"
#include "support/cases.hpp"

using ratest::AttnConfig;
using ratest::Problem;

namespace {

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

struct Request {
    struct Recv {
        ringattn_transport_msg_t m;
        int tag;
        bool done;
    };
    std::vector<Recv> recvs;
};

// One rank's transport (its `user`), and what the test checks of the library's calls.
struct Endpoint {
    std::shared_ptr<Mailbox> mb;
    int rank = 0;
    std::thread::id owner; // the rank's thread, which made the comm
    std::atomic<int> inside{0}, wrong_thread{0}, overlapped{0}, stale{0}, bad_message{0};
    std::set<Request *> live;
    int releases = 0, live_at_release = 0, late_writes = 0;
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

// Checks that every callback runs on the endpoint's thread, one at a time; a callback that
// does not (!ok) touches nothing and fails.
constexpr int MISPLACED = 93;
struct Guard {
    Endpoint &ep;
    bool ok = true;
    explicit Guard(Endpoint &e) : ep(e)
    {
        if (ep.inside.fetch_add(1) != 0) ++ep.overlapped, ok = false;
        if (std::this_thread::get_id() != ep.owner) ++ep.wrong_thread, ok = false;
    }
    ~Guard() { --ep.inside; }
};

Endpoint &ep_of(void *user) { return *static_cast<Endpoint *>(user); }

double timeout_s()
{
    const char *env = std::getenv("RINGATTN_COMM_TIMEOUT");
    return env && std::atof(env) > 0 ? std::atof(env) : 60.0;
}

int sendrecv_start(void *user, const ringattn_transport_msg_t *sends, int num_sends,
                   const ringattn_transport_msg_t *recvs, int num_recvs, int tag, void **request)
{
    Endpoint &ep = ep_of(user);
    Guard g(ep);
    if (!g.ok) return MISPLACED;
    if (ep.inject("sendrecv_start")) return FAULT;
    // the header's promises: a message at least, tags in range, none empty, peers that exist
    const auto well_formed = [&](const ringattn_transport_msg_t *m, int n) {
        bool ok = n >= 0 && (n == 0 || tag + n - 1 <= 32767);
        for (int i = 0; ok && i < n; ++i) ok = m[i].bytes > 0 && m[i].peer >= 0 && m[i].peer < ep.mb->size;
        return ok;
    };
    if (tag < 0 || num_sends + num_recvs < 1 || !well_formed(sends, num_sends) ||
        !well_formed(recvs, num_recvs)) {
        ++ep.bad_message;
        return 90;
    }
    auto *r = new Request;
    for (int j = 0; j < num_recvs; ++j) r->recvs.push_back({recvs[j], tag + j, false});
    {
        std::lock_guard<std::mutex> lk(ep.mb->mu);
        for (int i = 0; i < num_sends; ++i) {
            const auto *p = static_cast<const unsigned char *>(sends[i].buf);
            ep.mb->posted.push_back({ep.rank, sends[i].peer, tag + i, {p, p + sends[i].bytes}});
        }
    }
    ep.mb->cv.notify_all();
    ep.live.insert(r);
    *request = r;
    return 0;
}

// Lock held: takes the messages r waits for; 1 when all arrived, -1 on a size mismatch.
int match(Endpoint &ep, Request *r)
{
    int all = 1;
    for (Request::Recv &v : r->recvs) {
        if (v.done) continue;
        if (ep.deliver_late) {
            std::memset(v.m.buf, 0x5a, v.m.bytes); // a buffer freed early: ASan sees it
            v.done = true;
            ++ep.late_writes;
            continue;
        }
        auto &q = ep.mb->posted;
        for (auto it = q.begin(); it != q.end(); ++it) {
            if (it->src != v.m.peer || it->dst != ep.rank || it->tag != v.tag) continue;
            if (it->data.size() != v.m.bytes) return -1;
            std::memcpy(v.m.buf, it->data.data(), v.m.bytes);
            q.erase(it);
            v.done = true;
            break;
        }
        all = all && v.done;
    }
    return all;
}

// test (timeout 0) and wait: the messages that arrived taken, until all did or time is up.
int settle(void *user, void *request, double timeout, int *done, const char *callback)
{
    Endpoint &ep = ep_of(user);
    Guard g(ep);
    if (!g.ok) return MISPLACED;
    auto *r = static_cast<Request *>(request);
    if (!ep.live.count(r)) return ++ep.stale, 92;
    if (ep.inject(callback)) return FAULT;
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout);
    std::unique_lock<std::mutex> lk(ep.mb->mu);
    int m = match(ep, r);
    while (m == 0 && timeout > 0 && ep.mb->cv.wait_until(lk, until) != std::cv_status::timeout)
        m = match(ep, r);
    if (m == 0 && timeout > 0) m = match(ep, r);
    *done = m == 1;
    if (m == -1) return 91;
    if (*done) {
        ep.live.erase(r);
        delete r;
    }
    return 0;
}

int test(void *user, void *request, int *done) { return settle(user, request, 0, done, "test"); }

int wait(void *user, void *request, double timeout, int *done)
{
    return settle(user, request, timeout, done, "wait");
}

// A barrier: the last rank in publishes the result; a rank not joined in time is an error.
int allreduce(void *user, int64_t *vals, int n, ringattn_reduce_op_t op)
{
    Endpoint &ep = ep_of(user);
    Guard g(ep);
    if (!g.ok) return MISPLACED;
    if (ep.inject("allreduce")) return FAULT;
    Mailbox &mb = *ep.mb;
    std::unique_lock<std::mutex> lk(mb.mu);
    for (int i = 0; i < n; ++i) {
        int64_t &a = mb.acc[i];
        const int64_t v = vals[i];
        a = mb.arrived == 0 ? v
            : op == RINGATTN_REDUCE_SUM ? a + v
            : op == RINGATTN_REDUCE_MIN ? std::min(a, v)
                                        : std::max(a, v);
    }
    const unsigned long gen = mb.generation;
    if (++mb.arrived == mb.size) {
        std::memcpy(mb.result, mb.acc, sizeof mb.acc);
        mb.arrived = 0;
        ++mb.generation;
        mb.cv.notify_all();
    } else if (!mb.cv.wait_for(lk, std::chrono::duration<double>(timeout_s()),
                               [&] { return mb.generation != gen; })) {
        return 8;
    }
    std::memcpy(vals, mb.result, (size_t)n * sizeof *vals);
    return 0;
}

void release(void *user)
{
    Endpoint &ep = ep_of(user);
    Guard g(ep);
    if (!g.ok) return;
    ++ep.releases;
    ep.live_at_release = (int)ep.live.size();
    // the header lets a request still live here write its buffers (the library must not have
    // freed them): do so, for ASan to see
    for (Request *r : ep.live) {
        for (Request::Recv &v : r->recvs)
            if (!v.done) std::memset(v.m.buf, 0x5a, v.m.bytes);
        delete r;
    }
    ep.live.clear();
}

ringattn_transport_t table(Endpoint *ep)
{
    ringattn_transport_t t = RINGATTN_TRANSPORT_INIT;
    t.user = ep;
    t.sendrecv_start = sendrecv_start;
    t.test = test;
    t.wait = wait;
    t.allreduce = allreduce;
    t.release = release;
    return t;
}

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

    ringattn_status_t make(int rank, int ranks, ringattn_comm_t *comm)
    {
        Endpoint *ep;
        {
            std::lock_guard<std::mutex> lk(mu);
            if (!mb || made_in_run == mb->size) { // the first rank of a run
                mb = std::make_shared<Mailbox>();
                mb->size = ranks;
                made_in_run = 0;
            }
            ++made_in_run;
            endpoints.emplace_back(new Endpoint);
            ep = endpoints.back().get();
            ep->mb = mb;
            ep->rank = rank;
        }
        ep->owner = std::this_thread::get_id();
        if (rank == fault_rank) ep->fail = fail, ep->fail_at = fail_at;
        const ringattn_transport_t t = table(ep);
        return ringattn_comm_create_custom(&t, rank, ranks, comm);
    }
    // Rank r's endpoint in a network of one run (its comms were all made by plan creation).
    Endpoint &of(int r)
    {
        for (auto &ep : endpoints)
            if (ep->rank == r) return *ep;
        FAIL("no endpoint of rank " << r);
        return *endpoints.front();
    }

    ringtest::RunOptions options()
    {
        ringtest::RunOptions opt;
        opt.make_comm = [this](int r, int n, ringattn_comm_t *c) { return make(r, n, c); };
        return opt;
    }
};

// Every endpoint: each callback on its rank's thread, one at a time, well-formed, on live
// requests; released once, nothing the library gave up left untested.
void check_endpoints(const Network &net)
{
    for (const auto &ep : net.endpoints) {
        INFO("rank " << ep->rank);
        CHECK(ep->wrong_thread == 0);
        CHECK(ep->overlapped == 0);
        CHECK(ep->stale == 0);
        CHECK(ep->bad_message == 0);
        CHECK(ep->releases == 1);
        CHECK(ep->live_at_release == 0);
    }
}

AttnConfig bias_batch(const ratest::Mask &m)
{
    AttnConfig c = ratest::ring_batch(m);
    c.key_bias_heads = 2;
    c.keep_k = 5;
    c.num_threads = 2; // the kernels' polls from an OpenMP team: still the rank's thread
    return c;
}

} // namespace

TEST_CASE("ring over a custom transport is within SPEC 9 of the oracle", "[ring][custom]")
{
    for (const ratest::Mask &m : {ratest::ring_masks[0], ratest::ring_masks[5]}) {
        INFO("mask " << m.name);
        Network net;
        ringtest::check_every_layout(ratest::packed_problem(bias_batch(m), 500), {1, 2, 3},
                                     net.options());
        REQUIRE(net.endpoints.size() == 3 * (1 + 2 + 3));
        check_endpoints(net);
    }
}

TEST_CASE("a custom transport's callback failing mid-ring fails every rank within the deadline",
          "[ring][custom]")
{
    constexpr double DEADLINE = 1.0;
    setenv("RINGATTN_COMM_TIMEOUT", "1", 1);
    const Problem pb = ratest::packed_problem(bias_batch(ratest::ring_masks[0]), 501);
    struct Fault {
        const char *callback;
        int at, rank, ranks;
    };
    // rank 1 of 3: its second ring exchange (after the allgather's 2 batches and the first
    // exchange) is never posted, so rank 2 waits for it in vain; rank 0 of 2: its first test or
    // wait (which the kernels' polls or the wait make first) fails
    for (const Fault f : {Fault{"sendrecv_start", 3, 1, 3}, Fault{"test|wait", 0, 0, 2}}) {
        INFO(f.callback << " #" << f.at << " on rank " << f.rank << " of " << f.ranks);
        Network net;
        net.fault_rank = f.rank, net.fail = f.callback, net.fail_at = f.at;
        ringtest::RunOptions opt = net.options();
        opt.after_calls = [&](int rank) {
            Endpoint &ep = net.of(rank);
            ep.error_after_calls = ringattn_last_error();
            ep.deliver_late = true; // what the library gave up completes from now on
        };
        const auto t0 = std::chrono::steady_clock::now();
        const ringtest::Result r = ringtest::run(pb, f.ranks, RINGATTN_LAYOUT_CONTIGUOUS, opt);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        CHECK(s < 2 * DEADLINE + 2.0); // a wait's deadline, then at most one more; slack
        for (int rank = 0; rank < f.ranks; ++rank) {
            const Endpoint &ep = net.of(rank);
            INFO("rank " << rank << ": " << ep.error_after_calls);
            CHECK(r.rank_status[(size_t)rank] == RINGATTN_ERR_COMM);
            const std::string own = "rank " + std::to_string(rank) + ": the transport's ";
            if (rank == f.rank)
                CHECK(ep.error_after_calls.find(own) != std::string::npos);
            if (rank == f.rank)
                CHECK(ep.error_after_calls.find("returned 7") != std::string::npos);
            else // its deadline in a wait, or the test's allreduce timing out
                CHECK((ep.error_after_calls.find("no answer from rank") != std::string::npos ||
                       ep.error_after_calls.find("allreduce returned 8") != std::string::npos));
        }
        check_endpoints(net);
        if (f.ranks == 3) CHECK(net.of(2).late_writes > 0); // its give-up tested until done
    }
    unsetenv("RINGATTN_COMM_TIMEOUT");
}

TEST_CASE("a bad custom transport table is refused, nothing written", "[ring][custom]")
{
    Endpoint ep;
    ep.owner = std::this_thread::get_id();
    ep.mb = std::make_shared<Mailbox>();
    ep.mb->size = 1;
    const ringattn_transport_t good = table(&ep);
    const auto sentinel = reinterpret_cast<ringattn_comm_t>(0x1);
    struct Bad {
        const char *what;
        void (*edit)(ringattn_transport_t &);
        int rank, size;
    };
    const Bad bad[] = {
        {"struct_size: got 0", [](ringattn_transport_t &t) { t.struct_size = 0; }, 0, 1},
        {"struct_size: got", [](ringattn_transport_t &t) { t.struct_size += 8; }, 0, 1},
        {"sendrecv_start: got NULL", [](ringattn_transport_t &t) { t.sendrecv_start = nullptr; }, 0, 1},
        {"test: got NULL", [](ringattn_transport_t &t) { t.test = nullptr; }, 0, 1},
        {"wait: got NULL", [](ringattn_transport_t &t) { t.wait = nullptr; }, 0, 1},
        {"allreduce: got NULL", [](ringattn_transport_t &t) { t.allreduce = nullptr; }, 0, 1},
        {"size: got 0", [](ringattn_transport_t &) {}, 0, 0},
        {"rank: got -1", [](ringattn_transport_t &) {}, -1, 2},
        {"rank: got 2", [](ringattn_transport_t &) {}, 2, 2},
    };
    for (const Bad &b : bad) {
        INFO(b.what);
        ringattn_transport_t t = good;
        b.edit(t);
        ringattn_comm_t comm = sentinel;
        CHECK(ringattn_comm_create_custom(&t, b.rank, b.size, &comm) == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(std::string(ringattn_last_error()).find(b.what) != std::string::npos);
        CHECK(comm == sentinel);
    }
    ringattn_comm_t comm = sentinel;
    CHECK(ringattn_comm_create_custom(nullptr, 0, 1, &comm) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(comm == sentinel);
    CHECK(ringattn_comm_create_custom(&good, 0, 1, nullptr) == RINGATTN_ERR_INVALID_ARGUMENT);
    // the table is copied (the caller's may go), and release is optional: a plan made on a
    // one-rank comm runs the agreement's allreduce through the copy
    ringattn_transport_t t = good;
    t.release = nullptr;
    REQUIRE(ringattn_comm_create_custom(&t, 0, 1, &comm) == RINGATTN_SUCCESS);
    std::memset(&t, 0, sizeof t);
    int rank = -1, size = -1;
    CHECK(ringattn_comm_rank(comm, &rank, &size) == RINGATTN_SUCCESS);
    CHECK((rank == 0 && size == 1));
    const AttnConfig c = ratest::ring_batch(ratest::ring_masks[1]);
    const ringattn_plan_desc_t d = ratest::make_desc(c); // points into c
    ringattn_plan_t plan = nullptr;
    CHECK(ringattn_plan_create(comm, &d, &plan) == RINGATTN_SUCCESS);
    CHECK(ringattn_plan_destroy(plan) == RINGATTN_SUCCESS);
    CHECK(ringattn_comm_destroy(comm) == RINGATTN_SUCCESS);
    CHECK(ep.releases == 0);
    CHECK(ep.wrong_thread == 0);
}
