// The ring over a custom transport (include/ringattn_transport.h; the tests' mailbox transport,
// ring/mailbox_transport.hpp): ranks as threads, messages copied into a mailbox when sent and
// out of it when the receiver's request is tested, matched by (source, destination, tag) in
// order, and a barrier allreduce. P = 1, 2, 3 within
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
#include "ring/mailbox_transport.hpp"
#include "ringattn_transport.h"
#include "support/cases.hpp"

using ratest::AttnConfig;
using ratest::Problem;

namespace {

using namespace mailbox;

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

// A custom transport moves host memory (ringattn_transport.h): a ring of CUDA plans on one is
// refused at plan creation on every rank, saying which transport to use; one rank moves nothing
// and runs.
void check_cuda_ring_refused()
{
    const Problem pb = ratest::packed_problem(bias_batch(ratest::ring_masks[0]), 502);
    Network net;
    const ringtest::Result r = ringtest::run(pb, 2, RINGATTN_LAYOUT_CONTIGUOUS, net.options());
    for (int rank = 0; rank < 2; ++rank) {
        INFO("rank " << rank << ": " << r.rank_error[(size_t)rank]);
        CHECK(r.rank_status[(size_t)rank] == RINGATTN_ERR_UNSUPPORTED);
        CHECK(r.rank_error[(size_t)rank].find("moves host memory") != std::string::npos);
        CHECK(r.rank_error[(size_t)rank].find("threads_device") != std::string::npos);
    }
    Network one;
    ringtest::check_every_layout(pb, {1}, one.options());
}

} // namespace

TEST_CASE("ring over a custom transport is within SPEC 9 of the oracle", "[ring][custom]")
{
    if (ratest::on_cuda()) return check_cuda_ring_refused();
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
    if (ratest::on_cuda()) return; // no ring of CUDA plans on a custom transport (above)
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
