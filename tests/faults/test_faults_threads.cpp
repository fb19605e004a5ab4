// The fault scenarios (scenarios.hpp) over the transports of ranks as threads of this process:
// 4 ranks, RINGATTN_COMM_TIMEOUT = DEADLINE. On the CPU backend the threads transport and a
// custom one (the tests' mailbox, ring/mailbox_transport.hpp); on a device backend the
// device-copy threads transport and NCCL (the emulated library's fake): ringattn's own
// communicators, the same with NCCL's network transports' remote errors, and borrowed ones,
// which ringattn never aborts (their peers learn of a failure from its notice alone). Each
// scenario gets fresh comms, and its ranks' outcomes are judged after all threads have
// returned (none may hang: ctest's timeout).
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cstdlib>
#include <functional>
#include <string>
#include <thread>

#include "faults/scenarios.hpp"
#include "ring/mailbox_transport.hpp"
#include "ring/ring_harness.hpp"
#include "support/alloc_fault.hpp"

using namespace faults;

namespace {

constexpr int RANKS = 4;

struct ncclUniqueIdBytes { // ncclUniqueId's 128 bytes, passed by value as NCCL takes it
    unsigned char bytes[128];
};

void check_ok_outcome(const Outcome &o)
{
    INFO(o.what << ": " << o.message);
    CHECK(o.status == RINGATTN_SUCCESS);
}

// How a transport's comms are made: all at once (threads) or each by its rank's thread. After a
// rank's script, before its plan and tensors go, after_script(rank, outcomes); after it has
// destroyed its comm, done(rank): a borrowed NCCL communicator is the caller's to abort after a
// comm failure (its queued operations would hold every cudaFree of the device) and to destroy.
struct Transport {
    std::string name;
    bool tells_peers; // a failed comm fails its peers' calls at once (custom: no way to)
    std::function<ringattn_status_t(std::vector<ringattn_comm_t> &)> make_all;
    std::function<ringattn_status_t(int rank, ringattn_comm_t *)> make_one;
    std::function<void(int rank, const Outcomes &)> after_script = nullptr;
    std::function<void(int rank)> done = nullptr;
    bool remote_errors = false; // the fake NCCL's ra_emu_nccl_remote_errors while it runs
};

// The fake NCCL's own entry points, found by name in the emulated library.
struct FakeNccl {
    int (*init)(void **comm, int nranks, ncclUniqueIdBytes id, int rank) = nullptr;
    int (*destroy)(void *comm) = nullptr;
    int (*abort)(void *comm) = nullptr;
    ringattn_status_t (*borrow)(void *comm, ringattn_comm_t *out) = nullptr;
    void (*remote_errors)(int on) = nullptr;
    FakeNccl()
    {
        init = reinterpret_cast<decltype(init)>(dlsym(RTLD_DEFAULT, "ncclCommInitRank"));
        destroy = reinterpret_cast<decltype(destroy)>(dlsym(RTLD_DEFAULT, "ncclCommDestroy"));
        abort = reinterpret_cast<decltype(abort)>(dlsym(RTLD_DEFAULT, "ncclCommAbort"));
        borrow = reinterpret_cast<decltype(borrow)>(dlsym(RTLD_DEFAULT, "ringattn_comm_create_nccl"));
        remote_errors = reinterpret_cast<decltype(remote_errors)>(
            dlsym(RTLD_DEFAULT, "ra_emu_nccl_remote_errors"));
    }
    explicit operator bool() const { return init && destroy && abort && borrow && remote_errors; }
};

std::vector<Transport> transports()
{
    std::vector<Transport> t;
    const bool host = ratest::device_memory().is_host();
    t.push_back({host ? "threads" : "device-copy threads", true,
                 [](std::vector<ringattn_comm_t> &c) {
                     return ringtest::make_thread_comms((int)c.size(), c.data());
                 },
                 nullptr});
    if (host) {
        auto net = std::make_shared<mailbox::Network>();
        net->any_thread = true; // the scenarios call from several threads of a rank
        t.push_back({"custom", false, nullptr, [net](int r, ringattn_comm_t *c) {
                         return net->make(r, RANKS, c);
                     }});
    }
    const ringtest::NcclEntry nccl = ringtest::nccl_entry();
    const FakeNccl fake;
    if (host || !nccl || !fake || std::getenv("RATEST_GPU")) return t;
    auto id = std::make_shared<ncclUniqueIdBytes>();
    const auto new_id = [nccl, id](std::vector<ringattn_comm_t> &) {
        return nccl.get_id(id->bytes) == 0 ? RINGATTN_SUCCESS : RINGATTN_ERR_COMM;
    };
    const auto own = [nccl, id](int r, ringattn_comm_t *c) {
        return nccl.create(id->bytes, RANKS, r, -1, c);
    };
    t.push_back({"nccl", true, new_id, own});
    t.push_back({"nccl with remote errors", true, new_id, own, nullptr, nullptr, true});
    auto borrowed = std::make_shared<std::vector<void *>>(RANKS, nullptr);
    t.push_back({"nccl borrowed", true, new_id,
                 [fake, id, borrowed](int r, ringattn_comm_t *c) {
                     if (fake.init(&(*borrowed)[(size_t)r], RANKS, *id, r) != 0)
                         return RINGATTN_ERR_COMM;
                     return fake.borrow((*borrowed)[(size_t)r], c);
                 },
                 [fake, borrowed](int r, const Outcomes &outs) {
                     for (const Outcome &o : outs)
                         if (o.status == RINGATTN_ERR_COMM) { // as the message asks
                             fake.abort((*borrowed)[(size_t)r]);
                             (*borrowed)[(size_t)r] = nullptr;
                             return;
                         }
                 },
                 [fake, borrowed](int r) {
                     if ((*borrowed)[(size_t)r]) fake.destroy((*borrowed)[(size_t)r]);
                 }});
    return t;
}

// Every rank thread waits for the others (Rank::sync).
class Barrier {
  public:
    explicit Barrier(int n) : n_(n) {}
    void wait()
    {
        std::unique_lock<std::mutex> lk(mu_);
        const unsigned long gen = gen_;
        if (++arrived_ == n_) {
            arrived_ = 0, ++gen_;
            cv_.notify_all();
        } else {
            cv_.wait(lk, [&] { return gen_ != gen; });
        }
    }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    int n_, arrived_ = 0;
    unsigned long gen_ = 0;
};

std::vector<Outcomes> run_threads(const Transport &tr, const Scenario &s)
{
    Barrier barrier(RANKS);
    const FakeNccl fake;
    if (fake) fake.remote_errors(tr.remote_errors);
    std::vector<ringattn_comm_t> comms(RANKS, nullptr);
    if (tr.make_all) REQUIRE(tr.make_all(comms) == RINGATTN_SUCCESS);
    std::vector<Outcomes> outs(RANKS);
    std::vector<Outcome> made(RANKS);
    std::vector<ringattn_status_t> destroyed(RANKS, RINGATTN_SUCCESS);
    std::vector<std::thread> threads; // no Catch2 assertion in them: it is not thread-safe
    for (int r = 0; r < RANKS; ++r)
        threads.emplace_back([&, r] {
            ringattn_comm_t &comm = comms[(size_t)r];
            if (tr.make_one && (made[(size_t)r].status = tr.make_one(r, &comm)) != RINGATTN_SUCCESS) {
                made[(size_t)r].message = ringattn_last_error();
                return;
            }
            {
                Rank rank(comm);
                rank.set_sync([&barrier] { barrier.wait(); });
                made[(size_t)r] = rank.create();
                if (made[(size_t)r].status == RINGATTN_SUCCESS)
                    outs[(size_t)r] = s.script(r, RANKS, rank);
                if (tr.after_script) tr.after_script(r, outs[(size_t)r]);
            }
            if (tr.make_one) destroyed[(size_t)r] = ringattn_comm_destroy(comm);
            if (tr.done) tr.done(r);
        });
    for (auto &t : threads) t.join();
    if (fake) fake.remote_errors(0);
    if (!tr.make_one)
        for (auto c : comms) CHECK(ringattn_comm_destroy(c) == RINGATTN_SUCCESS);
    for (int r = 0; r < RANKS; ++r) {
        INFO("rank " << r << ": " << made[(size_t)r].message);
        REQUIRE(made[(size_t)r].status == RINGATTN_SUCCESS);
        CHECK(destroyed[(size_t)r] == RINGATTN_SUCCESS);
    }
    return outs;
}

} // namespace

TEST_CASE("faults over threads: no wrong result, no hang, every rank fails the same way",
          "[faults]")
{
    setenv("RINGATTN_COMM_TIMEOUT", std::to_string(DEADLINE).c_str(), 1);
    const bool host = ratest::device_memory().is_host();
    for (const Transport &tr : transports()) {
        for (const Scenario &s : scenarios()) {
            if (s.stalls_sgemm && !host) continue;     // a device backend's kernels: no sgemm
            if (s.times_out && !tr.tells_peers) continue; // DESIGN: custom peers end at their deadlines
            // a 2D plan over one comm splits it: the custom transport cannot (its users pass
            // two comms to ringattn_plan_create_2d)
            if (std::getenv("RATEST_ULYSSES") && tr.name == "custom") continue;
            SECTION(tr.name + ": " + s.name)
            {
                const std::vector<Outcomes> outs = run_threads(tr, s);
                for (int r = 0; r < RANKS; ++r) judge_rank(s, r, outs[(size_t)r]);
            }
        }
    }
}

TEST_CASE("a descriptor mismatch names the field on every rank", "[faults]")
{
    constexpr int P = 3;
    std::vector<ringattn_comm_t> comms(P);
    REQUIRE(ringtest::make_thread_comms(P, comms.data()) == RINGATTN_SUCCESS);
    std::vector<std::string> msgs(P);
    std::vector<ringattn_status_t> st(P);
    std::vector<std::thread> threads;
    for (int r = 0; r < P; ++r)
        threads.emplace_back([&, r] {
            ringattn_plan_desc_t d = problem_desc();
            if (r == 2) d.window_left = 7;
            ringattn_plan_t plan = nullptr;
            st[(size_t)r] = ringattn_plan_create(comms[(size_t)r], &d, &plan);
            msgs[(size_t)r] = ringattn_last_error();
            ringattn_plan_destroy(plan);
        });
    for (auto &t : threads) t.join();
    for (auto c : comms) ringattn_comm_destroy(c);
    for (int r = 0; r < P; ++r) {
        INFO("rank " << r << ": " << msgs[(size_t)r]);
        CHECK(st[(size_t)r] == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(msgs[(size_t)r].find("desc.window_left: differs between ranks") != std::string::npos);
    }
}

TEST_CASE("plan_create out of memory on one rank after the agreement fails on every rank",
          "[faults][alloc]")
{
    if (!allocfault::available()) {
        WARN("skipped under AddressSanitizer: the allocation interposer would bypass its allocator");
        return;
    }
    setenv("RINGATTN_COMM_TIMEOUT", std::to_string(DEADLINE).c_str(), 1);
    for (const Transport &tr : transports()) {
        SECTION(tr.name)
        {
            const Scenario s{"a big plan out of memory on rank 1, then a small plan's forward",
                             [](int rank, int, Rank &r) {
                                 Outcomes o{create_big_plan(r.comm(), rank == 1)};
                                 // ranks as threads share one emulated device, whose cudaFree
                                 // waits for every rank's queued work: the failed plans' frees
                                 // before a rank queues its next agreement
                                 r.sync();
                                 o.push_back(r.forward(1));
                                 return o;
                             },
                             [](int rank, const Outcomes &o) {
                                 INFO(o[0].message);
                                 CHECK(o[0].status == RINGATTN_ERR_OUT_OF_MEMORY);
                                 if (rank == 1) CHECK(o[0].message.find("refused here: 0]") == std::string::npos);
                                 CHECK(o[0].seconds < SLACK);
                                 INFO(o[1].message);
                                 CHECK(o[1].status == RINGATTN_SUCCESS); // the comm still works
                             }};
            const std::vector<Outcomes> outs = run_threads(tr, s);
            for (int r = 0; r < RANKS; ++r) judge_rank(s, r, outs[(size_t)r]);
        }
    }
}

TEST_CASE("the first backward out of memory on one rank fails on every rank, then works",
          "[faults][alloc]")
{
    if (!allocfault::available() || !ratest::device_memory().is_host()) {
        WARN("skipped: needs libc's allocator (no ASan) and the CPU backend, whose backward "
             "makes its slots at the first backward");
        return;
    }
    setenv("RINGATTN_COMM_TIMEOUT", std::to_string(DEADLINE).c_str(), 1);
    for (const Transport &tr : transports()) {
        SECTION(tr.name)
        {
            // the slots of a rank's 64 key rows are 4 ranges x 64 x 2 heads x 32 floats (64
            // KiB); the test's own buffers stay below 48 KiB
            const Scenario s{"the backward's slots out of memory on rank 1",
                             [](int rank, int, Rank &r) {
                                 Outcomes o{r.forward(1)};
                                 if (rank == 1) allocfault::arm(48 << 10);
                                 o.push_back(r.backward(1));
                                 allocfault::disarm();
                                 o.push_back(r.backward(1));
                                 return o;
                             },
                             [](int, const Outcomes &o) {
                                 check_ok_outcome(o[0]);
                                 INFO(o[1].message);
                                 CHECK(o[1].status == RINGATTN_ERR_OUT_OF_MEMORY);
                                 CHECK(o[1].seconds < SLACK);
                                 check_ok_outcome(o[2]);
                             }};
            const std::vector<Outcomes> outs = run_threads(tr, s);
            for (int r = 0; r < RANKS; ++r) judge_rank(s, r, outs[(size_t)r]);
        }
    }
}
