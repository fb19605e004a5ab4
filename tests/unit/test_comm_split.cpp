// The split of a comm into a 2D plan's group and ring comms (comm/comm.h: split_grid,
// ra__comm_split_grid) and the simulated comm (ringattn_comm_create_simulated). Internal: the
// transports' sources are compiled in (the shared library hides the ra__ functions), with
// api/comms.c for the public constructors. Over threads: every rank of 6 splits from its own
// thread into groups of 2 and of 3, and an allreduce and an exchange over each new comm reach
// exactly the ranks they should; the device-copy threads transport splits into device comms
// (over a host stand-in for device memory); a rank whose peers never split fails at the
// deadline. Refused: a group that does not divide the size, a failed comm, the custom
// transport; nothing written. The simulated comm: arguments, rank and size, its control plane,
// its refusals, and its split.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define _Alignas(n) alignas(n) // comm.h's C11 spelling, for C++
extern "C" {
#include "base/error.h"
#include "base/memory_ops.h"
#include "comm/comm.h"
#include "comm/simulated.h"
#include "comm/transports.h"
#include "ringattn_transport.h"
}

namespace {

// A host stand-in for a device's memory: copies run at once, streams and events are tokens.
std::atomic<int> device_copies{0};
thread_local int current_device = 0;

int fake_set_device(int device)
{
    const int previous = current_device;
    if (device >= 0) current_device = device;
    return previous;
}
ringattn_status_t fake_make(void **token) { return *token = std::malloc(1), RINGATTN_SUCCESS; }
void fake_release(void *token) { std::free(token); }
ringattn_status_t fake_record(void *, void *) { return RINGATTN_SUCCESS; }
ringattn_status_t fake_copy(void *dst, const void *src, size_t bytes, void *)
{
    ++device_copies;
    std::memcpy(dst, src, bytes);
    return RINGATTN_SUCCESS;
}
ringattn_status_t fake_query(void *, int *done) { return *done = 1, RINGATTN_SUCCESS; }

const ra_memory_ops fake_device = {
    "fake device", fake_set_device, fake_make, fake_release, fake_make, fake_release,
    fake_record,   fake_record,     fake_copy, fake_query,   nullptr,   nullptr,
    nullptr,       nullptr,         nullptr,   nullptr};

} // namespace

// api/comms.c's device memory (kernels/backends.c in the library): the stand-in.
extern "C" const struct ra_memory_ops *ra__backend_device_memory(void) { return &fake_device; }

namespace {

struct Split {
    ringattn_status_t status = RINGATTN_ERR_INTERNAL;
    std::string error;
    ringattn_comm_t out[2] = {nullptr, nullptr};
    int rank[2] = {-1, -1}, size[2] = {-1, -1};
    int on_device[2] = {-1, -1}, device[2] = {-2, -2};
    int64_t sum[2] = {0, 0};        // allreduce SUM of the parent ranks + 1
    int64_t received[2] = {-1, -1}; // from the previous rank of the new comm: its parent rank
    ringattn_status_t moved[2] = {RINGATTN_ERR_INTERNAL, RINGATTN_ERR_INTERNAL};
};

// One message around the ring of c: this rank's parent rank to the next, the previous's back.
ringattn_status_t pass_on(ringattn_comm_t c, int64_t parent_rank, int64_t *received)
{
    int64_t send = parent_rank;
    ra_exchange x;
    std::memset(&x, 0, sizeof x);
    x.send[0] = {&send, sizeof send, (c->rank + 1) % c->size};
    x.recv[0] = {received, sizeof *received, (c->rank + c->size - 1) % c->size};
    const ringattn_status_t st = ra__comm_start(c, &x, nullptr);
    return st != RINGATTN_SUCCESS ? st : ra__comm_wait(c, &x);
}

// Every rank of comms splits into groups of `group` from its own thread, then reduces and
// passes a message over both new comms. The caller destroys them (Split::out).
std::vector<Split> split_all(std::vector<ringattn_comm_t> &comms, int group)
{
    std::vector<Split> got(comms.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < comms.size(); ++r)
        threads.emplace_back([&, r] {
            Split &s = got[r];
            s.status = ra__comm_split_grid(comms[r], "test_split", group, s.out);
            if (s.status != RINGATTN_SUCCESS) {
                s.error = ra__last_error();
                return;
            }
            for (int i = 0; i < 2; ++i) {
                ringattn_comm_t c = s.out[i];
                s.rank[i] = c->rank, s.size[i] = c->size;
                s.on_device[i] = c->on_device, s.device[i] = c->device;
                s.sum[i] = (int64_t)r + 1;
                if (c->ops->allreduce_i64(c, &s.sum[i], 1, RA_REDUCE_SUM) != RINGATTN_SUCCESS)
                    s.sum[i] = -1;
                s.moved[i] = pass_on(c, (int64_t)r, &s.received[i]);
            }
        });
    for (auto &t : threads) t.join();
    return got;
}

// Group g holds parent ranks g*group .. g*group + group - 1; the ring at place p the ranks
// p, p + group, ...
void check_grid(const std::vector<Split> &got, int group)
{
    const int n = (int)got.size(), rings = n / group;
    for (int r = 0; r < n; ++r) {
        const Split &s = got[(size_t)r];
        INFO("parent rank " << r << " of " << n << ", groups of " << group << ": " << s.error);
        REQUIRE(s.status == RINGATTN_SUCCESS);
        const int g = r / group, p = r % group;
        CHECK(s.rank[0] == p);
        CHECK(s.size[0] == group);
        CHECK(s.rank[1] == g);
        CHECK(s.size[1] == rings);
        int64_t group_sum = 0, ring_sum = 0;
        for (int i = 0; i < group; ++i) group_sum += g * group + i + 1;
        for (int k = 0; k < rings; ++k) ring_sum += k * group + p + 1;
        CHECK(s.sum[0] == group_sum);
        CHECK(s.sum[1] == ring_sum);
        CHECK(s.moved[0] == RINGATTN_SUCCESS);
        CHECK(s.moved[1] == RINGATTN_SUCCESS);
        CHECK(s.received[0] == g * group + (p + group - 1) % group);
        CHECK(s.received[1] == ((g + rings - 1) % rings) * group + p);
    }
}

void destroy(std::vector<Split> &got, std::vector<ringattn_comm_t> &comms)
{
    for (auto &s : got)
        for (ringattn_comm_t c : s.out) CHECK(ringattn_comm_destroy(c) == RINGATTN_SUCCESS);
    for (ringattn_comm_t c : comms) CHECK(ringattn_comm_destroy(c) == RINGATTN_SUCCESS);
}

bool has(const std::string &text, const std::string &part)
{
    return text.find(part) != std::string::npos;
}

ringattn_comm_t bogus() { return reinterpret_cast<ringattn_comm_t>(std::uintptr_t{0x5a5a}); }

} // namespace

TEST_CASE("threads: 6 ranks split into groups of 2 and of 3", "[split][threads]")
{
    for (int group : {2, 3, 1, 6}) {
        for (int round = 0; round < 2; ++round) { // twice: no state is left from the first
            INFO("groups of " << group << ", round " << round);
            std::vector<ringattn_comm_t> comms(6);
            REQUIRE(ringattn_comm_create_threads(6, comms.data()) == RINGATTN_SUCCESS);
            std::vector<Split> got = split_all(comms, group);
            check_grid(got, group);
            for (const Split &s : got) {
                CHECK(s.on_device[0] == 0);
                CHECK(s.on_device[1] == 0);
            }
            destroy(got, comms);
        }
    }
}

TEST_CASE("threads_device: the new comms are device comms on the parent's device",
          "[split][threads]")
{
    std::vector<ringattn_comm_t> comms(6);
    REQUIRE(ringattn_comm_create_threads_device(6, 0, comms.data()) == RINGATTN_SUCCESS);
    device_copies = 0;
    std::vector<Split> got = split_all(comms, 3);
    check_grid(got, 3);
    for (const Split &s : got)
        for (int i = 0; i < 2; ++i) {
            CHECK(s.on_device[i] == 1);
            CHECK(s.device[i] == 0);
        }
    CHECK(device_copies == 12); // one copy per rank and new comm: the device path moved them
    destroy(got, comms);
}

TEST_CASE("threads: a rank whose peers never split fails at the deadline", "[split][threads]")
{
    ringattn_comm_t comms[2];
    REQUIRE(ringattn_comm_create_threads(2, comms) == RINGATTN_SUCCESS);
    setenv("RINGATTN_COMM_TIMEOUT", "0.3", 1);
    ringattn_comm_t out[2] = {bogus(), bogus()};
    const ringattn_status_t st = ra__comm_split_grid(comms[0], "test_split", 1, out);
    const std::string error = ra__last_error();
    unsetenv("RINGATTN_COMM_TIMEOUT");
    INFO(error);
    CHECK(st == RINGATTN_ERR_COMM);
    CHECK(has(error, "test_split: splitting the comm: ringattn comm threads: rank 0"));
    CHECK(has(error, "the comm has failed"));
    CHECK(out[0] == bogus());
    CHECK(out[1] == bogus());
    // the peer hears of it: its split fails at once, not at the deadline
    CHECK(ra__comm_split_grid(comms[1], "test_split", 1, out) == RINGATTN_ERR_COMM);
    CHECK(has(ra__last_error(), "the comm failed earlier"));
    for (ringattn_comm_t c : comms) CHECK(ringattn_comm_destroy(c) == RINGATTN_SUCCESS);
}

TEST_CASE("a group that does not divide the size is refused, nothing written", "[split]")
{
    std::vector<ringattn_comm_t> comms(6);
    REQUIRE(ringattn_comm_create_threads(6, comms.data()) == RINGATTN_SUCCESS);
    for (int group : {4, 0, -2, 12}) {
        INFO("group " << group);
        ringattn_comm_t out[2] = {bogus(), bogus()};
        // refused before any collective: one rank alone gets its answer
        CHECK(ra__comm_split_grid(comms[0], "test_split", group, out) ==
              RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(std::string(ra__last_error()) ==
              "test_split: group: got " + std::to_string(group) +
                  ", expected a divisor of the comm's 6 ranks");
        CHECK(out[0] == bogus());
        CHECK(out[1] == bogus());
        CHECK(comms[0]->failed == 0);
    }
    for (ringattn_comm_t c : comms) CHECK(ringattn_comm_destroy(c) == RINGATTN_SUCCESS);
}

TEST_CASE("a failed comm is refused at once", "[split]")
{
    ringattn_comm_t comms[2];
    REQUIRE(ringattn_comm_create_threads(2, comms) == RINGATTN_SUCCESS);
    (void)ra__comm_fail(comms[0], ra__fail(RINGATTN_ERR_COMM, "a test's failure"));
    ringattn_comm_t out[2] = {bogus(), bogus()};
    CHECK(ra__comm_split_grid(comms[0], "test_split", 1, out) == RINGATTN_ERR_COMM);
    CHECK(has(ra__last_error(), "test_split: the comm failed earlier (a test's failure)"));
    CHECK(out[0] == bogus());
    for (ringattn_comm_t c : comms) CHECK(ringattn_comm_destroy(c) == RINGATTN_SUCCESS);
}

namespace {
int never_start(void *, const ringattn_transport_msg_t *, int, const ringattn_transport_msg_t *,
                int, int, void **)
{
    return 1;
}
int never_test(void *, void *, int *done) { return *done = 0, 1; }
int never_wait(void *, void *, double, int *done) { return *done = 0, 1; }
int never_reduce(void *, int64_t *, int, ringattn_reduce_op_t) { return 1; }
} // namespace

TEST_CASE("the custom transport cannot split: refused with what to do instead", "[split]")
{
    ringattn_transport_t t = RINGATTN_TRANSPORT_INIT;
    t.sendrecv_start = never_start;
    t.test = never_test;
    t.wait = never_wait;
    t.allreduce = never_reduce;
    ringattn_comm_t c = nullptr;
    REQUIRE(ringattn_comm_create_custom(&t, 1, 4, &c) == RINGATTN_SUCCESS);
    ringattn_comm_t out[2] = {bogus(), bogus()};
    CHECK(ra__comm_split_grid(c, "ringattn_plan_create", 2, out) == RINGATTN_ERR_UNSUPPORTED);
    CHECK(std::string(ra__last_error()) ==
          "ringattn_plan_create: the custom transport cannot split a comm: pass the group and "
          "ring comms to ringattn_plan_create_2d");
    CHECK(out[0] == bogus());
    CHECK(out[1] == bogus());
    CHECK(c->failed == 0);
    CHECK(ringattn_comm_destroy(c) == RINGATTN_SUCCESS);
}

TEST_CASE("simulated: arguments, rank and size", "[simulated]")
{
    ringattn_comm_t c = bogus();
    for (auto bad : {std::make_pair(0, 0), std::make_pair(-1, 4), std::make_pair(4, 4),
                     std::make_pair(0, -3)}) {
        INFO("rank " << bad.first << " of " << bad.second);
        CHECK(ringattn_comm_create_simulated(bad.first, bad.second, &c) ==
              RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(has(ra__last_error(), "ringattn_comm_create_simulated: "));
        CHECK(c == bogus());
    }
    CHECK(ringattn_comm_create_simulated(0, 1, nullptr) == RINGATTN_ERR_INVALID_ARGUMENT);
    REQUIRE(ringattn_comm_create_simulated(5, 8, &c) == RINGATTN_SUCCESS);
    int rank = -1, size = -1;
    REQUIRE(ringattn_comm_rank(c, &rank, &size) == RINGATTN_SUCCESS);
    CHECK(rank == 5);
    CHECK(size == 8);
    CHECK(c->on_device == 0);
    CHECK(c->simulated == 1); // plan creation's memory check lets any backend's plan through
    const ra_transport_info *t = ra__transport_find("simulated");
    REQUIRE(t != nullptr);
    CHECK(t->built == 1);
    CHECK(std::string(c->ops->name) == "simulated");
    CHECK(ringattn_comm_destroy(c) == RINGATTN_SUCCESS);
    CHECK(ringattn_comm_destroy(c) == RINGATTN_ERR_INVALID_USAGE); // gone
}

TEST_CASE("simulated: every rank passes what this one passes; no data moves", "[simulated]")
{
    ringattn_comm_t c = nullptr;
    REQUIRE(ringattn_comm_create_simulated(2, 4, &c) == RINGATTN_SUCCESS);
    int64_t v[3] = {7, -3, INT64_MAX / 2};
    REQUIRE(c->ops->allreduce_i64(c, v, 3, RA_REDUCE_MIN) == RINGATTN_SUCCESS);
    CHECK((v[0] == 7 && v[1] == -3 && v[2] == INT64_MAX / 2));
    REQUIRE(c->ops->allreduce_i64(c, v, 3, RA_REDUCE_SUM) == RINGATTN_SUCCESS);
    CHECK((v[0] == 28 && v[1] == -12 && v[2] == INT64_MAX)); // 4 times, saturated
    // the agreement of a call passes (every rank agrees with itself)
    int64_t vals[1] = {42};
    CHECK(ra__comm_agree(c, "test", RA_CALL_PLAN_CREATE, 0, RINGATTN_SUCCESS, vals, 1) ==
          RINGATTN_SUCCESS);
    CHECK(vals[0] == 42);
    // an allgather: this rank's bytes at its place, zeros elsewhere
    const size_t bytes[4] = {2, 0, 3, 1};
    const unsigned char mine[3] = {1, 2, 3};
    unsigned char all[6];
    std::memset(all, 0xee, sizeof all);
    REQUIRE(ra__comm_allgather(c, mine, all, bytes) == RINGATTN_SUCCESS);
    const unsigned char want[6] = {0, 0, 1, 2, 3, 0};
    CHECK(std::memcmp(all, want, sizeof all) == 0);
    // calls are refused at their stream's check, before their agreement
    CHECK(ra__comm_check_stream(c, "ringattn_forward", nullptr) == RINGATTN_ERR_UNSUPPORTED);
    CHECK(std::string(ra__last_error()) ==
          "ringattn_forward: a simulated comm moves no data: its plans report their schedule "
          "and traffic (ringattn_plan_get_info), their calls are refused");
    CHECK(c->failed == 0);
    ra_exchange x;
    std::memset(&x, 0, sizeof x);
    CHECK(ra__comm_start(c, &x, nullptr) == RINGATTN_ERR_UNSUPPORTED);
    CHECK(ringattn_comm_destroy(c) == RINGATTN_SUCCESS);
}

TEST_CASE("simulated: its split gives the grid's ranks and sizes", "[simulated][split]")
{
    struct Case {
        int rank, size, group, group_rank, ring_rank, rings;
    };
    for (const Case &k : {Case{5, 8, 4, 1, 1, 2}, Case{5, 8, 8, 5, 0, 1}, Case{5, 8, 1, 0, 5, 8},
                          Case{4, 6, 2, 0, 2, 3}, Case{4, 6, 3, 1, 1, 2}}) {
        INFO("rank " << k.rank << " of " << k.size << ", groups of " << k.group);
        ringattn_comm_t c = nullptr;
        REQUIRE(ringattn_comm_create_simulated(k.rank, k.size, &c) == RINGATTN_SUCCESS);
        ringattn_comm_t out[2] = {nullptr, nullptr};
        REQUIRE(ra__comm_split_grid(c, "test_split", k.group, out) == RINGATTN_SUCCESS);
        int rank = -1, size = -1;
        REQUIRE(ringattn_comm_rank(out[0], &rank, &size) == RINGATTN_SUCCESS);
        CHECK(rank == k.group_rank);
        CHECK(size == k.group);
        REQUIRE(ringattn_comm_rank(out[1], &rank, &size) == RINGATTN_SUCCESS);
        CHECK(rank == k.ring_rank);
        CHECK(size == k.rings);
        CHECK(std::string(out[0]->ops->name) == "simulated");
        CHECK(std::string(out[1]->ops->name) == "simulated");
        CHECK((out[0]->simulated == 1 && out[1]->simulated == 1));
        for (ringattn_comm_t o : out) CHECK(ringattn_comm_destroy(o) == RINGATTN_SUCCESS);
        CHECK(ringattn_comm_destroy(c) == RINGATTN_SUCCESS);
    }
}
