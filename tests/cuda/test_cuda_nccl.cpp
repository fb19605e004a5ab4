// The ring on the CUDA backend over the NCCL transport (comm/nccl.c). Ranks as threads of one
// process, each on its own communicator from one unique id and its own stream: in CI against
// the emulated library and its fake NCCL (emu/fake_nccl.cpp), which tests the
// library's use of NCCL, not NCCL: against the float64 oracle under SPEC 9 as the single-rank
// CUDA plan is, bitwise repeatable under other thread schedules and stream drain orders (a
// missing event between the call's stream and the transport's shows as a difference), and a
// rank that leaves the call, or withholds its sends, makes every rank fail with
// RINGATTN_ERR_COMM within the deadline. Ranks as processes ([procs]): forked, each with its
// own NCCL_HOSTID, the way real NCCL takes several ranks on one GPU (bench/gpu/check.sh runs
// them there; the fake's ranks are threads, so in CI only P = 1 runs as a process).
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "ring/ring_check.hpp"
#include "support/cases.hpp"
#include "support/device.hpp"

using ratest::AttnConfig;
using ratest::Mask;
using ratest::Problem;
using ringtest::Result;
using ringtest::RunOptions;

namespace {

// A build without NCCL (a CUDA build configured without RINGATTN_ENABLE_NCCL) has nothing to test.
// On a GPU, NCCL refuses two ranks of one communicator on one device ("Duplicate GPU
// detected"): there the transport is tested with processes (DESIGN: the NCCL transport), not here.
bool have_nccl()
{
    if (std::getenv("RATEST_GPU")) {
        WARN("a real GPU: NCCL refuses ranks as threads on one device; nothing to test here");
        return false;
    }
    if (ringtest::nccl_entry()) return true;
    WARN("this library has no NCCL transport (RINGATTN_ENABLE_NCCL=OFF): nothing to test");
    return false;
}

RunOptions over_nccl()
{
    RunOptions o;
    o.nccl = true;
    return o;
}

// The NCCL ring at every P in `ranks` under every layout (the single plan is test_cuda_ring's).
void check_ring(const Problem &pb, std::initializer_list<int> ranks)
{
    ringtest::check_every_layout(pb, ranks, over_nccl(), false);
}

// The ring with P processes (forked), each on its own communicator from one unique id, its
// outputs passed back through shared memory and summed (every other rank's entries are 0).
// Each rank has its own NCCL_HOSTID, so NCCL takes P processes on one GPU as P hosts (over its
// socket transport); a "Duplicate GPU detected" refusal is a skip, its reason in `skip`. The
// fake NCCL's ranks are threads of one process: there only P = 1 can run.
struct ProcessSlot {
    std::atomic<int> state; // 0 running, 1 done, 2 skipped
    ringattn_status_t status;
    char reason[512];
};

Result run_processes(const Problem &pb, int P, ringattn_layout_t layout, std::string &skip,
                     const RunOptions &opt = RunOptions())
{
    Result sum = ringtest::blank(pb, 0.0f); // no CUDA call in this process before the forks
    std::vector<std::vector<float> *> parts = {&sum.o, &sum.lse, &sum.dq, &sum.dk, &sum.dv};
    size_t floats = 0;
    for (auto *v : parts) floats += v->size();
    const size_t slot_bytes = sizeof(ProcessSlot) + floats * sizeof(float);
    const size_t bytes = 256 + (size_t)P * slot_bytes;
    void *shm = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(shm != MAP_FAILED);
    std::memset(shm, 0, bytes);
    auto *id_ready = static_cast<std::atomic<int> *>(shm);
    unsigned char *id = static_cast<unsigned char *>(shm) + 64; // 128 bytes
    auto slot = [&](int r) {
        return reinterpret_cast<ProcessSlot *>(static_cast<unsigned char *>(shm) + 256 +
                                               (size_t)r * slot_bytes);
    };
    std::vector<pid_t> pids;
    for (int r = 0; r < P; ++r) {
        const pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid > 0) {
            pids.push_back(pid);
            continue;
        }
        // the child: no CUDA or NCCL call was made before the fork
        ProcessSlot *me = slot(r);
        setenv("NCCL_HOSTID", ("ringattn-test-rank-" + std::to_string(r)).c_str(), 1);
        const ringtest::NcclEntry nccl = ringtest::nccl_entry();
        if (r == 0) {
            me->status = nccl.get_id(id) == 0 ? RINGATTN_SUCCESS : RINGATTN_ERR_COMM;
            id_ready->store(me->status == RINGATTN_SUCCESS ? 1 : 2);
        }
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (id_ready->load() == 0 && std::chrono::steady_clock::now() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ringattn_comm_t comm = nullptr;
        me->status = id_ready->load() == 1 ? nccl.create(id, P, r, -1, &comm) : RINGATTN_ERR_COMM;
        std::snprintf(me->reason, sizeof me->reason, "%s", ringattn_last_error());
        if (me->status != RINGATTN_SUCCESS) {
            me->state.store(std::strstr(me->reason, "Duplicate GPU") ? 2 : 1);
            _exit(0);
        }
        const Result mine = ringtest::run_rank(pb, comm, r, layout, opt);
        ringattn_comm_destroy(comm);
        me->status = mine.status;
        std::snprintf(me->reason, sizeof me->reason, "%s", ringattn_last_error());
        float *out = reinterpret_cast<float *>(me + 1);
        for (auto *v : {&mine.o, &mine.lse, &mine.dq, &mine.dk, &mine.dv})
            out = std::copy(v->begin(), v->end(), out);
        me->state.store(1);
        _exit(0);
    }
    // every child within 120 s, else killed (a hang is a failure, not a wait)
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (pid_t pid : pids) {
        int wst = 0;
        while (waitpid(pid, &wst, WNOHANG) == 0) {
            if (std::chrono::steady_clock::now() > until) kill(pid, SIGKILL);
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
    sum.rank_status.assign((size_t)P, RINGATTN_ERR_COMM);
    for (int r = 0; r < P; ++r) {
        const ProcessSlot *s = slot(r);
        if (s->state.load() == 1) sum.rank_status[(size_t)r] = s->status;
        if (s->state.load() == 2) skip = s->reason;
        if (s->state.load() == 0) sum.status = RINGATTN_ERR_COMM; // killed or crashed
        else if (s->status != RINGATTN_SUCCESS && sum.status == RINGATTN_SUCCESS) {
            sum.status = s->status;
            UNSCOPED_INFO("rank " << r << ": " << s->reason);
        }
        const float *in = reinterpret_cast<const float *>(s + 1);
        for (auto *v : parts)
            for (float &x : *v) x += *in++;
    }
    munmap(shm, bytes);
    return sum;
}

} // namespace

TEST_CASE("NCCL ring of processes: P = 1 (self), and P = 2, 4 on one GPU with NCCL_HOSTID", "[cuda][nccl][procs]")
{
    if (!ringtest::nccl_entry()) {
        WARN("this library has no NCCL transport (RINGATTN_ENABLE_NCCL=OFF): nothing to test");
        return;
    }
    // the fake NCCL's ranks are threads of one process: processes can only be P = 1 there
    const bool fake = dlsym(RTLD_DEFAULT, "ra_emu_nccl_withhold_sends") != nullptr;
    const Problem pb = ratest::packed_problem(ratest::ring_batch(ratest::ring_masks[5]), 250);
    const ratest::Spec9 judge = ringtest::judge_of(pb);
    for (int P : {1, 2, 4}) {
        if (fake && P > 1) {
            WARN("P = " << P << " processes: skipped (the fake NCCL joins threads, not processes)");
            continue;
        }
        for (ringattn_layout_t layout : {RINGATTN_LAYOUT_ZIGZAG, RINGATTN_LAYOUT_STRIPED}) {
            std::string skip;
            const Result r = run_processes(pb, P, layout, skip);
            if (!skip.empty()) {
                WARN("P = " << P << " processes: skipped: NCCL refused them on one GPU: " << skip);
                break;
            }
            ringtest::check_result(r, judge, pb,
                                   "processes " + std::to_string(P) + ", layout " +
                                       std::to_string(layout));
        }
    }
}

TEST_CASE("NCCL ring of processes: a rank that leaves the call fails the others within the deadline", "[cuda][nccl][procs][faults]")
{
    if (!ringtest::nccl_entry() || dlsym(RTLD_DEFAULT, "ra_emu_nccl_withhold_sends")) {
        WARN("needs real NCCL (processes on a GPU); the fake's case is the threads' one below");
        return;
    }
    setenv("RINGATTN_COMM_TIMEOUT", "2", 1);
    const Problem pb = ratest::packed_problem(ratest::ring_batch(ratest::ring_masks[0]), 251);
    RunOptions opt;
    opt.leave_rank = 1;
    std::string skip;
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = run_processes(pb, 2, RINGATTN_LAYOUT_CONTIGUOUS, skip, opt);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    unsetenv("RINGATTN_COMM_TIMEOUT");
    if (!skip.empty()) {
        WARN("skipped: NCCL refused two processes on one GPU: " << skip);
        return;
    }
    INFO("seconds: " << secs);
    CHECK(r.rank_status[0] == RINGATTN_ERR_COMM);
    CHECK(r.rank_status[1] == RINGATTN_SUCCESS); // it left: no call, no failure
    CHECK(secs < 15.0);
}

TEST_CASE("NCCL ring: every layout at P = 1..4, causal, narrow windows, bf16", "[cuda][nccl]")
{
    if (!have_nccl()) return;
    uint64_t seed = 200;
    for (const Mask &m : {ratest::ring_masks[1], ratest::ring_masks[3]}) {
        INFO("mask " << m.name);
        check_ring(ratest::packed_problem(ratest::ring_batch(m), ++seed), {1, 2, 3, 4});
    }
    check_ring(ratest::packed_problem(ratest::ring_batch(ratest::ring_masks[5], RINGATTN_BFLOAT16), 210),
               {2, 4});
}

TEST_CASE("NCCL ring: bitwise repeatable under other schedules and stream drain orders", "[cuda][nccl]")
{
    if (!have_nccl()) return;
    AttnConfig c = ratest::ring_batch({"causal+window", 1, 40, -1});
    c.key_bias_heads = 2;
    c.keep_k = 7;
    const Problem pb = ratest::packed_problem(c, 230);
    ratest::set_schedule(0);
    const Result a = ringtest::run(pb, 3, RINGATTN_LAYOUT_ZIGZAG, over_nccl());
    REQUIRE(a.status == RINGATTN_SUCCESS);
    for (int kind : {1, 2}) {
        ratest::set_schedule(kind, 99);
        const Result b = ringtest::run(pb, 3, RINGATTN_LAYOUT_ZIGZAG, over_nccl());
        ratest::set_schedule(0);
        REQUIRE(b.status == RINGATTN_SUCCESS);
        ringtest::check_bitwise_same(a, b);
    }
}

TEST_CASE("NCCL ring: a rank that leaves the call fails every other rank within the deadline", "[cuda][nccl][faults]")
{
    if (!have_nccl()) return;
    setenv("RINGATTN_COMM_TIMEOUT", "2", 1);
    const Problem pb = ratest::packed_problem(ratest::ring_batch(ratest::ring_masks[1]), 240);
    RunOptions opt = over_nccl();
    opt.leave_rank = 1;
    const auto t0 = std::chrono::steady_clock::now();
    const Result r = ringtest::run(pb, 3, RINGATTN_LAYOUT_CONTIGUOUS, opt);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    unsetenv("RINGATTN_COMM_TIMEOUT");
    CHECK(r.status == RINGATTN_ERR_COMM);
    CHECK(secs < 10.0);
    INFO("seconds: " << secs);
}

// Issue 28, finding 3: with every rank of the process on the one legacy stream of the device,
// a rank's exchange queued behind a peer's wait for it deadlocked until the deadline, and a
// rank could succeed on data its aborted peers never sent while they failed. Refused up front.
TEST_CASE("NCCL ring: ranks of one device on the legacy default stream are refused on every rank",
          "[cuda][nccl][faults]")
{
    if (!have_nccl()) return;
    RunOptions opt = over_nccl();
    opt.default_stream = true;
    const Problem pb = ratest::packed_problem(ratest::ring_batch(ratest::ring_masks[1]), 242);
    for (int P : {3, 4}) {
        const auto t0 = std::chrono::steady_clock::now();
        const Result r = ringtest::run(pb, P, RINGATTN_LAYOUT_ZIGZAG, opt);
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        INFO("P " << P << ", seconds " << secs);
        for (int rank = 0; rank < P; ++rank) CHECK(r.rank_status[(size_t)rank] == RINGATTN_ERR_UNSUPPORTED);
        CHECK(secs < 5.0); // refused before anything waits
    }
}

TEST_CASE("NCCL ring: a rank that withholds its sends fails every rank within the deadline", "[cuda][nccl][faults]")
{
    if (!have_nccl()) return;
    // the fake NCCL's hook: rank r of every communicator posts its first n sends, then none
    using withhold_t = void (*)(int, unsigned long);
    const auto withhold = reinterpret_cast<withhold_t>(dlsym(RTLD_DEFAULT, "ra_emu_nccl_withhold_sends"));
    REQUIRE(withhold != nullptr);
    setenv("RINGATTN_COMM_TIMEOUT", "2", 1);
    const Problem pb = ratest::packed_problem(ratest::ring_batch({"none", 0, -1, -1}), 241);
    // after both agreements (all-reduces, no sends): from its first send, and mid-ring
    for (unsigned long after : {0ul, 1ul}) {
        withhold(1, after);
        const auto t0 = std::chrono::steady_clock::now();
        const Result r = ringtest::run(pb, 3, RINGATTN_LAYOUT_ZIGZAG, over_nccl());
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        withhold(-1, 0);
        INFO("sends before withholding: " << after << ", seconds: " << secs);
        for (size_t rank = 0; rank < r.rank_status.size(); ++rank) {
            INFO("rank " << rank);
            CHECK(r.rank_status[rank] == RINGATTN_ERR_COMM);
        }
        CHECK(secs < 10.0); // the 2 s deadline, with room for a loaded machine
    }
    unsetenv("RINGATTN_COMM_TIMEOUT");
}
