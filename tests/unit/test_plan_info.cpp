// ringattn_plan_get_info: the tiles the backend decided, the memory a plan holds (all of it made
// at plan creation: forward and backward calls allocate nothing), and its backend.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

#include "support/cases.hpp"

using namespace ratest;

namespace {

ringattn_plan_info_t info_of(const Plan &p)
{
    ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
    REQUIRE(ringattn_plan_get_info(p.get(), &info) == RINGATTN_SUCCESS);
    return info;
}

AttnConfig small_config()
{
    AttnConfig c;
    c.H = 4;
    c.Hkv = 2;
    c.D = 32;
    c.cu_q = {0, 300, 700};
    c.causal = true;
    c.num_threads = 2;
    return c;
}

} // namespace

TEST_CASE("plan info: tiles decided at creation, the memory the plan holds", "[info]")
{
    AttnConfig c = small_config();
    Plan dflt(c);
    require_plan(dflt);
    const ringattn_plan_info_t a = info_of(dflt);
    CHECK(a.backend == test_backend());
    CHECK(a.workspace_bytes > 0);
    CHECK(a.buffer_bytes > 0); // the SPEC 9 row stats, [H, rows] twice
    CHECK(a.host_bytes > 0);
    CHECK(a.memory_bytes == a.workspace_bytes + a.buffer_bytes + a.host_bytes);
    CHECK(a.bias_bytes_received == 0);
    if (on_cuda()) { // the kernels' tiles: 64 queries, the float32 kernel's 16 keys
        CHECK(a.block_q == 64);
        CHECK(a.block_k == 16);
        return; // other tiles are refused (test_cuda_errors)
    }
    CHECK(a.block_q == 256); // the CPU backend's default (DESIGN: CPU kernels)
    CHECK(a.block_k == 256);

    c.block_q = 32;
    c.block_k = 48;
    Plan tuned(c);
    require_plan(tuned);
    const ringattn_plan_info_t b = info_of(tuned);
    CHECK(b.block_q == 32);
    CHECK(b.block_k == 48);
    CHECK(b.workspace_bytes < a.workspace_bytes); // tiles of 32 x 48, not 256 x 256

    c.num_threads = 1; // the workspace is per thread
    Plan one(c);
    require_plan(one);
    CHECK(info_of(one).workspace_bytes < b.workspace_bytes);
}

TEST_CASE("plan info in a ring: the ring's buffers and the gathered bias", "[info][ring]")
{
    AttnConfig c = small_config();
    c.key_bias_heads = 2;
    c.keep_k = 16;
    const int P = 3;
    std::vector<ringattn_comm_t> comms(P);
    REQUIRE(make_thread_comms(P, comms.data()) == RINGATTN_SUCCESS);
    std::vector<ringattn_plan_info_t> infos(P);
    std::vector<std::thread> th;
    for (int r = 0; r < P; ++r)
        th.emplace_back([&, r] {
            ringattn_plan_desc_t d = make_desc(c);
            ringattn_plan_t p = nullptr;
            infos[r] = RINGATTN_PLAN_INFO_INIT;
            if (ringattn_plan_create(comms[r], &d, &p) == RINGATTN_SUCCESS)
                ringattn_plan_get_info(p, &infos[r]);
            ringattn_plan_destroy(p);
        });
    for (auto &t : th) t.join();
    for (auto x : comms) ringattn_comm_destroy(x);
    for (int r = 0; r < P; ++r) {
        INFO("rank " << r);
        const ringattn_plan_info_t &i = infos[r];
        REQUIRE(i.ranks == P);
        // every other rank's bias, float32, H_b = 2 rows of them
        CHECK(i.bias_bytes_received == (size_t)(700 - i.local_tokens) * 2 * sizeof(float));
        // at least the two K/V exchange buffers of a shard, float32
        CHECK(i.buffer_bytes >= 2 * (size_t)i.local_tokens * 2 * (32 + 32) * sizeof(float));
        CHECK(i.memory_bytes == i.workspace_bytes + i.buffer_bytes + i.host_bytes);
    }
}

#if !defined(__SANITIZE_ADDRESS__)
// This executable's allocator entry points take the place of libc's for the whole process (the
// library's calls included): while `counting` is set, every allocation is counted.
extern "C" void *__libc_malloc(size_t);
extern "C" void *__libc_calloc(size_t, size_t);
extern "C" void *__libc_realloc(void *, size_t);
extern "C" void *__libc_memalign(size_t, size_t);
static std::atomic<bool> counting{false};
static std::atomic<long> allocations{0};
static void count() { if (counting) ++allocations; }
// The CPU backend's calls only: the emulated CUDA runtime allocates on the host in every launch.
static bool counts_host_allocations()
{
    if (on_cuda()) WARN("host allocations are counted on the CPU backend only");
    return !on_cuda();
}
extern "C" void *malloc(size_t n) { count(); return __libc_malloc(n); }
extern "C" void *calloc(size_t a, size_t b) { count(); return __libc_calloc(a, b); }
extern "C" void *realloc(void *p, size_t n) { count(); return __libc_realloc(p, n); }
extern "C" void *aligned_alloc(size_t a, size_t n) { count(); return __libc_memalign(a, n); }
extern "C" int posix_memalign(void **p, size_t a, size_t n)
{
    count();
    *p = __libc_memalign(a, n);
    return *p ? 0 : 12; // ENOMEM
}

TEST_CASE("forward and backward allocate nothing after the plan is made", "[info]")
{
    // Every byte a call needs was made at plan creation (a first call warms OpenMP's and
    // OpenBLAS's threads up).
    if (!counts_host_allocations()) return;
    for (int selects = 0; selects < 2; ++selects) {
        AttnConfig c = small_config();
        if (selects) c.key_bias_heads = 2, c.keep_k = 40;
        std::mt19937_64 rng(seed_for("alloc", (uint64_t)selects));
        Problem pb(c, Storage::Packed, rng);
        Plan plan(c);
        require_plan(plan);
        run_both(plan, pb);
        ringattn_status_t st[3][2];
        ringattn_tensors_t t = pb.tensors(); // host memory: the library's calls alone
        allocations = 0;
        counting = true;
        for (int i = 0; i < 3; ++i) { // no Catch2 assertion in between: it allocates
            st[i][0] = ringattn_forward(plan.get(), &t, nullptr);
            st[i][1] = ringattn_backward(plan.get(), &t, nullptr);
        }
        counting = false;
        INFO("selection " << selects);
        for (auto &s : st) CHECK((s[0] == RINGATTN_SUCCESS && s[1] == RINGATTN_SUCCESS));
        CHECK(allocations == 0);
    }
}

TEST_CASE("a ring call over threads allocates nothing after the plan is made", "[info][ring]")
{
    // The threads transport keeps its message records in the exchanges themselves.
    if (!counts_host_allocations()) return;
    AttnConfig c = small_config();
    c.key_bias_heads = 2;
    c.keep_k = 40;
    c.num_threads = 1;
    const int P = 3;
    std::vector<ringattn_comm_t> comms(P);
    REQUIRE(ringattn_comm_create_threads(P, comms.data()) == RINGATTN_SUCCESS);
    std::vector<std::vector<ringattn_status_t>> st(P);
    std::atomic<int> warm{0}, done{0};
    std::vector<std::thread> th;
    for (int r = 0; r < P; ++r)
        th.emplace_back([&, r] {
            ringattn_plan_desc_t d = make_desc(c);
            d.layout = RINGATTN_LAYOUT_ZIGZAG;
            ringattn_plan_t p = nullptr;
            st[r].push_back(ringattn_plan_create(comms[r], &d, &p));
            int64_t n = 0;
            ringattn_plan_local_tokens(p, &n, nullptr);
            const size_t q = (size_t)n * c.H * c.D, kv = (size_t)n * c.hkv() * c.D;
            std::vector<float> Q(q, 0.5f), K(kv, 0.25f), V(kv, 1.0f), O(q), dO(q, 1.0f);
            std::vector<float> dQ(q), dK(kv), dV(kv), lse((size_t)n * c.H + 1);
            std::vector<float> bias((size_t)n * 2 + 1, 0.5f), dbias(bias.size());
            for (size_t i = 0; i < bias.size(); ++i) bias[i] = (float)((i * 7919) % 101) / 50.0f;
            ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
            t.q.data = Q.data(), t.k.data = K.data(), t.v.data = V.data(), t.o.data = O.data();
            t.lse = lse.data(), t.dout.data = dO.data(), t.dq.data = dQ.data();
            t.dk.data = dK.data(), t.dv.data = dV.data();
            t.key_bias = bias.data(), t.dbias = dbias.data();
            st[r].push_back(ringattn_forward(p, &t, nullptr)); // warm-up
            st[r].push_back(ringattn_backward(p, &t, nullptr));
            st[r].reserve(8);
            if (++warm == P) allocations = 0, counting = true;
            while (!counting) std::this_thread::yield();
            for (int i = 0; i < 2; ++i) {
                st[r].push_back(ringattn_forward(p, &t, nullptr));
                st[r].push_back(ringattn_backward(p, &t, nullptr));
            }
            if (++done == P) counting = false;
            while (counting) std::this_thread::yield();
            ringattn_plan_destroy(p);
        });
    for (auto &t : th) t.join();
    for (auto x : comms) ringattn_comm_destroy(x);
    for (int r = 0; r < P; ++r)
        for (ringattn_status_t s : st[r]) CHECK(s == RINGATTN_SUCCESS);
    CHECK(allocations == 0);
}
#endif
