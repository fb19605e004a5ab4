// The SIMT emulation's scheduler (DESIGN: CUDA: the SIMT emulation): runs each block's threads as
// fibers under a policy, implements __syncthreads, the deferred cp.async and dynamic shared
// memory, and turns a block in which no thread can run into a report naming what each thread waits
// at.
#include <cstdio>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "emu/counters.h"
#include "emu/emu_internal.h"

namespace ra_emu {

namespace {

thread_local Block *running = nullptr;
thread_local Policy chosen = Policy::round_robin;
thread_local uint64_t rng_state = 0;
thread_local std::string launch_error;
thread_local const std::function<void()> *body_of_launch = nullptr;

size_t stack_bytes()
{
    const char *env = std::getenv("RA_EMU_STACK_KB");
    const long kb = env ? std::atol(env) : 0;
    return (size_t)(kb > 0 ? kb : 256) * 1024;
}

uint64_t next_random()
{
    uint64_t x = rng_state ? rng_state : 0x9e3779b97f4a7c15ull;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return rng_state = x;
}

void thread_main(void *arg)
{
    Thread *t = static_cast<Thread *>(arg);
    try {
        (*body_of_launch)();
        // a GPU leaves copies in flight at a thread's exit undefined: the kernel must wait
        if (!t->copies.empty() && running->error.empty())
            running->error = "thread " + std::to_string(t->tid) + " exited with " +
                             std::to_string(t->copies.size()) + " cp.async copies in flight (no "
                             "cp.async.wait_group covers them before its exit)";
    } catch (const Unwind &) { // its block failed: its frames are unwound
    }
    t->state = State::done;
    t->site = Site{"exited", 0};
    fiber_exit_to_scheduler(t->fiber);
}

// The next thread to run under the policy, or -1 when none can.
int pick(const Block &b, int last)
{
    const int n = b.nthreads;
    auto can = [&](int i) { return b.threads[i].state == State::runnable; };
    switch (chosen) {
    case Policy::lowest_first:
        for (int i = 0; i < n; ++i) if (can(i)) return i;
        return -1;
    case Policy::highest_first:
        for (int i = n - 1; i >= 0; --i) if (can(i)) return i;
        return -1;
    case Policy::random: {
        int count = 0;
        for (int i = 0; i < n; ++i) count += can(i);
        if (!count) return -1;
        int k = (int)(next_random() % (uint64_t)count);
        for (int i = 0; i < n; ++i) if (can(i) && k-- == 0) return i;
        return -1;
    }
    case Policy::round_robin:
        for (int d = 1; d <= n; ++d) if (can((last + d) % n)) return (last + d) % n;
        return -1;
    }
    return -1;
}

const char *state_name(State s)
{
    switch (s) {
    case State::at_barrier: return "__syncthreads";
    case State::at_warp: return "a warp collective";
    case State::done: return "exited";
    default: return "runnable";
    }
}

// "threads 0-63: __syncthreads at fwd.cuh:212; 64-127: exited"
std::string deadlock_report(const Block &b)
{
    std::string r = "deadlock: no thread can run; threads ";
    for (int i = 0; i < b.nthreads;) {
        const Thread &t = b.threads[i];
        int j = i;
        while (j + 1 < b.nthreads && b.threads[j + 1].state == t.state &&
               site_str(b.threads[j + 1].site) == site_str(t.site))
            ++j;
        r += std::to_string(i) + (j > i ? "-" + std::to_string(j) : "") + ": " +
             state_name(t.state) + (t.state == State::done ? "" : " at " + site_str(t.site));
        r += j + 1 < b.nthreads ? "; " : "";
        i = j + 1;
    }
    return r;
}

void resume(Block &b, Thread &t)
{
    const int i = t.tid;
    b.current = &t;
    lane_log = counters_lane(b, i);
    threadIdx = uint3{(unsigned)(i % blockDim.x), (unsigned)(i / blockDim.x % blockDim.y),
                      (unsigned)(i / (blockDim.x * blockDim.y))};
    fiber_from_scheduler(t.fiber);
}

// Runs one block to its end; its error (or "") in b.error.
void run_block(Block &b)
{
    for (Thread &t : b.threads) {
        fiber_reset(t.fiber, thread_main, &t);
        t.state = State::runnable;
        t.copies.clear();
        t.open_group = t.landed_groups = 0;
    }
    b.barrier_arrived = 0;
    for (auto &w : b.warps) w.clear();
    b.error.clear();
    b.unwinding = false;
    int last = -1, done = 0;
    while (b.error.empty()) {
        const int i = pick(b, last);
        if (i < 0) {
            for (const Thread &t : b.threads) done += t.state == State::done;
            if (done < b.nthreads) b.error = deadlock_report(b);
            break;
        }
        last = i;
        resume(b, b.threads[i]);
    }
    b.unwinding = true; // after a failure: every parked thread unwinds its frames
    for (Thread &t : b.threads)
        if (t.state != State::done) resume(b, t);
}

} // namespace

Block &block() { return *running; }

// "fwd.cuh:212": the file's base name and the line.
std::string site_str(const Site &s)
{
    const char *f = s.file ? s.file : "?", *slash = std::strrchr(f, '/');
    return std::string(slash ? slash + 1 : f) + ":" + std::to_string(s.line);
}

void fail_block(const std::string &msg)
{
    Block &b = block();
    if (b.error.empty()) b.error = msg;
    throw Unwind{};
}

void park(State state, Site site)
{
    Thread *t = block().current;
    t->state = state;
    t->site = site;
    fiber_to_scheduler(t->fiber);
    if (block().unwinding) throw Unwind{};
}

void barrier(Site s)
{
    Block &b = block();
    if (b.barrier_arrived == 0) b.barrier_site = s;
    else if (site_str(b.barrier_site) != site_str(s))
        fail_block("divergent __syncthreads: thread " + std::to_string(b.current->tid) + " at " +
                   site_str(s) + ", other threads at " + site_str(b.barrier_site));
    if (++b.barrier_arrived < b.nthreads) return park(State::at_barrier, s);
    b.barrier_arrived = 0; // the last one releases the others
    count_barrier();
    counters_flush_block(b); // every thread's requests before the barrier are complete
    for (Thread &t : b.threads)
        if (t.state == State::at_barrier) t.state = State::runnable;
}

unsigned char *dynamic_smem() { return block().smem; }
size_t dynamic_smem_bytes() { return block().smem_bytes; }

void cp_async16(void *dst, const void *src, bool pred, Site s)
{
    count_access(Kind::cp_async, dst, 16, s);
    if (pred) count_access(Kind::ld_global, src, 16, s);
    Thread *t = block().current;
    PendingCopy c{dst, {}, t->open_group};
    if (pred) std::memcpy(c.bytes, src, 16);
    t->copies.push_back(c);
}

void cp_async_commit()
{
    Thread *t = block().current;
    ++t->open_group;
    count_cp_async_commit(t->open_group - t->landed_groups);
}

void cp_async_wait(int keep)
{
    Thread *t = block().current;
    const int landed_below = t->open_group - keep; // groups [0, landed_below) land
    if (landed_below > t->landed_groups) t->landed_groups = landed_below;
    size_t kept = 0;
    for (size_t i = 0; i < t->copies.size(); ++i) {
        PendingCopy &c = t->copies[i];
        if (c.group < landed_below) std::memcpy(c.dst, c.bytes, 16);
        else t->copies[kept++] = c;
    }
    t->copies.resize(kept);
}

void set_policy(Policy p, uint64_t seed)
{
    chosen = p;
    rng_state = seed;
}
Policy policy() { return chosen; }
const char *last_error() { return launch_error.c_str(); }

namespace {

// How many OS threads run a launch's blocks (RA_EMU_WORKERS, default: the machine's cores).
unsigned worker_count(unsigned long blocks)
{
    const char *env = std::getenv("RA_EMU_WORKERS");
    unsigned n = env && std::atoi(env) > 0 ? (unsigned)std::atoi(env)
                                           : std::thread::hardware_concurrency();
    n = n ? n : 1;
    return (unsigned)(blocks < n ? blocks : n);
}

struct LaunchShared {
    LaunchCounters counters; // summed over the workers
    dim3 grid, bdim;
    size_t smem_bytes;
    const std::function<void()> *body;
    Policy policy;
    uint64_t seed;
    std::atomic<unsigned long> next{0};
    std::mutex mu;
    unsigned long failed_block = ~0ul; // the lowest failing block, for a deterministic report
    std::string error;
};

// One worker: its own fibers and shared memory; takes blocks until none is left.
void work(LaunchShared &L)
{
    const unsigned long n = (unsigned long)L.bdim.x * L.bdim.y * L.bdim.z;
    Block b;
    b.nthreads = (int)n;
    b.threads.resize(n);
    b.warps.resize((n + 31) / 32);
    std::vector<unsigned char> smem(L.smem_bytes + 16);
    b.smem = smem.data() + (16 - (uintptr_t)smem.data() % 16) % 16; // 16-byte aligned
    b.smem_bytes = L.smem_bytes;
    bool ok = true;
    for (unsigned long i = 0; i < n && ok; ++i) {
        b.threads[i].tid = (int)i;
        ok = fiber_alloc(b.threads[i].fiber, stack_bytes());
    }
    Block *outer = running;
    LaneLog *const outer_lane = lane_log;
    const Policy outer_policy = chosen;
    const uint64_t outer_seed = rng_state;
    running = &b;
    body_of_launch = L.body;
    blockDim = L.bdim;
    gridDim = L.grid;
    const unsigned long blocks = (unsigned long)L.grid.x * L.grid.y * L.grid.z;
    LaunchCounters mine;
    for (unsigned long k; ok && (k = L.next++) < blocks;) {
        blockIdx = uint3{(unsigned)(k % L.grid.x), (unsigned)(k / L.grid.x % L.grid.y),
                         (unsigned)(k / ((unsigned long)L.grid.x * L.grid.y))};
        set_policy(L.policy, L.seed ^ (k * 0x9e3779b97f4a7c15ull)); // per block: any worker
        std::memset(b.smem, 0xff, L.smem_bytes); // unwritten shared memory reads NaN
        counters_block_begin(b, &mine);
        run_block(b);
        counters_block_end(b);
        if (b.error.empty()) continue;
        std::lock_guard<std::mutex> lk(L.mu);
        if (k < L.failed_block) {
            L.failed_block = k;
            L.error = "block (" + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) +
                      "," + std::to_string(blockIdx.z) + "): " + b.error;
        }
    }
    if (!ok) {
        std::lock_guard<std::mutex> lk(L.mu);
        if (L.error.empty()) L.error = "launch: no memory for the threads' stacks";
    }
    if (counting_on) {
        std::lock_guard<std::mutex> lk(L.mu);
        L.counters.add(mine);
    }
    running = outer;
    lane_log = outer_lane;
    chosen = outer_policy;
    rng_state = outer_seed;
    for (Thread &t : b.threads) fiber_free(t.fiber);
}

} // namespace

int launch(dim3 grid, dim3 bdim, size_t smem_bytes, const std::function<void()> &body,
           const char *kernel)
{
    launch_error.clear();
    const long n = (long)bdim.x * bdim.y * bdim.z;
    if (n < 1 || n > 1024 || grid.x < 1 || grid.y < 1 || grid.z < 1) {
        launch_error = "launch: block of " + std::to_string(n) + " threads or an empty grid";
        return -1;
    }
    if (smem_bytes > max_dynamic_smem) {
        launch_error = "launch: " + std::to_string(smem_bytes) +
                       " bytes of dynamic shared memory, above the limit of " +
                       std::to_string(max_dynamic_smem);
        return -1;
    }
    LaunchShared L;
    L.grid = grid, L.bdim = bdim, L.smem_bytes = smem_bytes, L.body = &body;
    L.policy = chosen, L.seed = rng_state;
    const unsigned workers = worker_count((unsigned long)grid.x * grid.y * grid.z);
    std::vector<std::thread> pool;
    for (unsigned w = 1; w < workers; ++w) pool.emplace_back(work, std::ref(L));
    work(L); // the launching thread is a worker too
    for (std::thread &t : pool) t.join();
    if (counting_on) {
        L.counters.kernel = kernel ? kernel : "kernel";
        L.counters.grid = grid, L.counters.block = bdim, L.counters.smem = smem_bytes;
        counters_report(L.counters);
    }
    launch_error = L.error;
    return launch_error.empty() ? 0 : -1;
}

} // namespace ra_emu
