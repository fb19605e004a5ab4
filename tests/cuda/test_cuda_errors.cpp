// What the CUDA backend refuses, and how it reports device errors, through the public API:
// every refusal a status with a message naming the argument, nothing written (outputs keep
// their poison); stream-ordered calls that return before the device has run them (emulation:
// its deferred streams show it); a device fault as RINGATTN_ERR_CUDA, never an abort.
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "support/cases.hpp"

using namespace ratest;

namespace {

template <class F> F runtime(const char *name)
{
    F f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
    REQUIRE(f != nullptr);
    return f;
}

AttnConfig small(ringattn_dtype_t dt = RINGATTN_BFLOAT16)
{
    AttnConfig c;
    c.dtype = dt, c.H = 2, c.Hkv = 1, c.D = 32, c.cu_q = {0, 40, 100};
    c.causal = true;
    return c;
}

bool has(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

// A call on pb's tensors with tensor `patch` applied; O and LSE must keep their poison.
ringattn_status_t call_patched(const Plan &plan, Problem &pb,
                               void (*patch)(ringattn_tensors_t &, Problem &))
{
    pb.poison_forward_outputs();
    ringattn_tensors_t t = pb.tensors();
    patch(t, pb);
    const ringattn_status_t st = ringattn_forward(plan.get(), &t, nullptr);
    const std::string msg = ringattn_last_error();
    pb.from_device();
    CHECK(pb.o.get(0, 0, 0) != pb.o.get(0, 0, 0)); // still NaN: nothing written
    CHECK(std::isnan(pb.lse[0]));
    INFO(msg);
    return st;
}

} // namespace

TEST_CASE("CUDA: plans the kernels cannot run are refused with a message", "[cuda][errors]")
{
    struct Bad {
        const char *what;
        void (*edit)(AttnConfig &);
        ringattn_status_t want;
        const char *msg;
    };
    const Bad bad[] = {
        {"head_dim 12 (bf16 loads 8 at a time)", [](AttnConfig &c) { c.D = 12; },
         RINGATTN_ERR_UNSUPPORTED, "head_dim: got 12"},
        {"head_dim_v 20", [](AttnConfig &c) { c.Dv = 20; }, RINGATTN_ERR_UNSUPPORTED,
         "head_dim_v: got 20"},
        {"a tile size", [](AttnConfig &c) { c.block_k = 32, c.cpu_tiles_everywhere = true; },
         RINGATTN_ERR_UNSUPPORTED, "block_q/block_k"},
    };
    for (const Bad &b : bad) {
        AttnConfig c = small();
        b.edit(c);
        Plan p(c);
        INFO(b.what << ": " << ringattn_last_error());
        CHECK(p.status() == b.want);
        CHECK(has(ringattn_last_error(), b.msg));
    }
    AttnConfig c = small();
    ringattn_plan_desc_t d = make_desc(c);
    d.device = 7;
    ringattn_plan_t p = nullptr;
    CHECK(ringattn_plan_create(nullptr, &d, &p) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(has(ringattn_last_error(), "device: got 7, expected -1 or a device ordinal below"));
    CHECK(p == nullptr);
}

// Plan creation on two ranks of comms (threads), each with descriptor edit(rank): statuses and
// messages.
static void create_on_two(ringattn_comm_t comms[2], void (*edit)(int, ringattn_plan_desc_t &),
                   ringattn_status_t st[2], std::string msg[2])
{
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r)
        ranks.emplace_back([&, r] {
            const AttnConfig c = small(); // make_desc points into it
            ringattn_plan_desc_t d = make_desc(c);
            edit(r, d);
            ringattn_plan_t p = nullptr;
            st[r] = ringattn_plan_create(comms[r], &d, &p);
            msg[r] = ringattn_last_error();
            ringattn_plan_destroy(p);
        });
    for (std::thread &t : ranks) t.join();
}

TEST_CASE("CUDA: a ring's comm must move the plan's memory, on the plan's device", "[cuda][errors]")
{
    ringattn_comm_t host[2], dev[2];
    REQUIRE(ringattn_comm_create_threads(2, host) == RINGATTN_SUCCESS);
    REQUIRE(ringattn_comm_create_threads_device(2, 0, dev) == RINGATTN_SUCCESS);
    ringattn_status_t st[2];
    std::string msg[2];
    // CUDA plans on the host-memory threads transport
    create_on_two(host, [](int, ringattn_plan_desc_t &) {}, st, msg);
    for (int r = 0; r < 2; ++r) {
        INFO("rank " << r << ": " << msg[r]);
        CHECK(st[r] == RINGATTN_ERR_UNSUPPORTED);
        CHECK(has(msg[r], "ringattn_comm_create_threads_device"));
    }
    // CPU plans on the device transport
    create_on_two(dev, [](int, ringattn_plan_desc_t &d) { d.backend = RINGATTN_BACKEND_CPU; }, st, msg);
    for (int r = 0; r < 2; ++r) {
        INFO("rank " << r << ": " << msg[r]);
        CHECK(st[r] == RINGATTN_ERR_UNSUPPORTED);
        CHECK(has(msg[r], "moves device memory"));
    }
    // rank 1's plan on device 1, the comm's copies on device 0: both ranks fail
    create_on_two(dev, [](int r, ringattn_plan_desc_t &d) { d.device = r; }, st, msg);
    CHECK(st[0] == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(st[1] == RINGATTN_ERR_INVALID_ARGUMENT);
    INFO(msg[1]);
    CHECK(has(msg[1], "device: got 1, expected 0"));
    // and then the right plans work on the same comms
    create_on_two(dev, [](int, ringattn_plan_desc_t &) {}, st, msg);
    CHECK(st[0] == RINGATTN_SUCCESS);
    CHECK(st[1] == RINGATTN_SUCCESS);
    for (ringattn_comm_t cm : host) ringattn_comm_destroy(cm);
    for (ringattn_comm_t cm : dev) ringattn_comm_destroy(cm);
    // bad arguments of the device transport itself
    CHECK(ringattn_comm_create_threads_device(0, 0, dev) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(ringattn_comm_create_threads_device(2, -2, dev) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(ringattn_comm_create_threads_device(2, 7, dev) == RINGATTN_ERR_CUDA);
    CHECK(has(ringattn_last_error(), "device 7"));
}

TEST_CASE("CUDA: host memory and misaligned tensors are refused before anything runs, both directions",
          "[cuda][errors]")
{
    std::mt19937_64 rng(seed_for("cuda errors", 0));
    AttnConfig c = small();
    Problem pb(c, Storage::Packed, rng);
    Plan plan(c);
    require_plan(plan);
    // host memory where the plan wants device memory
    CHECK(call_patched(plan, pb, [](ringattn_tensors_t &t, Problem &p) {
              t.k.data = p.k.buf->bytes.data();
          }) == RINGATTN_ERR_CUDA);
    CHECK(has(ringattn_last_error(), "k: got"));
    CHECK(has(ringattn_last_error(), "expected device memory"));
    static std::vector<float> host_lse(1000);
    CHECK(call_patched(plan, pb, [](ringattn_tensors_t &t, Problem &) { t.lse = host_lse.data(); }) ==
          RINGATTN_ERR_CUDA);
    CHECK(has(ringattn_last_error(), "lse: got"));
    // a Q that starts 2 bytes into its buffer, and a row stride the 16-byte loads cannot take
    CHECK(call_patched(plan, pb, [](ringattn_tensors_t &t, Problem &) {
              t.q.data = static_cast<char *>(t.q.data) + 2;
          }) == RINGATTN_ERR_UNSUPPORTED);
    CHECK(has(ringattn_last_error(), "q: got address"));
    CHECK(call_patched(plan, pb, [](ringattn_tensors_t &t, Problem &) {
              t.v.row_stride = 36; // 32 columns, then 4 of padding: not whole 16-byte chunks
              t.v.head_stride = 32;
          }) == RINGATTN_ERR_UNSUPPORTED);
    CHECK(has(ringattn_last_error(), "v: got address"));
    CHECK(has(ringattn_last_error(), "multiples of 8 elements"));
    // the backward: a host gradient buffer
    ringattn_tensors_t t = pb.tensors();
    t.dq.data = pb.dq.buf->bytes.data();
    CHECK(ringattn_backward(plan.get(), &t, nullptr) == RINGATTN_ERR_CUDA);
    CHECK(has(ringattn_last_error(), "dq: got"));
    // and the plan still works, forward and backward
    CHECK(check_against_oracle(plan, pb));
}

TEST_CASE("CUDA: a call enqueues on the caller's stream and returns without waiting", "[cuda][stream]")
{
    if (!set_schedule(0)) {
        SUCCEED("on a GPU the device runs the work as soon as it can: nothing to observe here");
        return;
    }
    using create_fn = int (*)(void **);
    using sync_fn = int (*)(void *);
    const auto create = runtime<create_fn>("cudaStreamCreate");
    const auto sync = runtime<sync_fn>("cudaStreamSynchronize");
    const auto destroy = runtime<sync_fn>("cudaStreamDestroy");
    const auto copy = runtime<int (*)(void *, const void *, size_t, int)>("cudaMemcpy");
    void *stream = nullptr;
    REQUIRE(create(&stream) == 0);
    std::mt19937_64 rng(seed_for("cuda stream", 0));
    for (ringattn_dtype_t dt : all_dtypes) {
        AttnConfig c = small(dt);
        Problem pb(c, Storage::Packed, rng);
        Plan plan(c);
        require_plan(plan);
        pb.poison_forward_outputs();
        ringattn_tensors_t t = pb.tensors();
        REQUIRE(ringattn_forward(plan.get(), &t, stream) == RINGATTN_SUCCESS);
        // the emulated streams run only when synchronised: the call has not waited for its work
        // (cudaMemcpy synchronises only the default stream, not this one)
        float first = 0.0f;
        REQUIRE(copy(&first, t.lse, sizeof first, 4) == 0);
        CHECK(std::isnan(first));
        REQUIRE(sync(stream) == 0);
        REQUIRE(copy(&first, t.lse, sizeof first, 4) == 0);
        CHECK(std::isfinite(first));
    }
    CHECK(destroy(stream) == 0);
}

TEST_CASE("CUDA: a plan on another device than the current one works there and puts it back",
          "[cuda][device]")
{
    using count_fn = int (*)(int *);
    using set_fn = int (*)(int);
    int n = 0;
    REQUIRE(runtime<count_fn>("cudaGetDeviceCount")(&n) == 0);
    if (n < 2) {
        SUCCEED("one device: nothing to switch between");
        return;
    }
    const auto get = runtime<count_fn>("cudaGetDevice");
    const auto set = runtime<set_fn>("cudaSetDevice");
    std::mt19937_64 rng(seed_for("cuda device", 0));
    AttnConfig c = small();
    Problem pb(c, Storage::Packed, rng);
    REQUIRE(set(1) == 0);
    (void)pb.tensors(); // the tests' device copies made on device 1
    REQUIRE(set(0) == 0);
    ringattn_plan_desc_t d = make_desc(c);
    d.device = 1;
    ringattn_plan_t p = nullptr;
    REQUIRE(ringattn_plan_create(nullptr, &d, &p) == RINGATTN_SUCCESS);
    int cur = -1;
    CHECK((get(&cur) == 0 && cur == 0)); // plan creation put the caller's device back
    ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
    REQUIRE(ringattn_plan_get_info(p, &info) == RINGATTN_SUCCESS);
    CHECK(info.device == 1);
    pb.poison_forward_outputs();
    ringattn_tensors_t t = pb.tensors();
    CHECK(ringattn_forward(p, &t, nullptr) == RINGATTN_SUCCESS);
    INFO(ringattn_last_error());
    CHECK((get(&cur) == 0 && cur == 0)); // and so did the call
    pb.from_device();
    CHECK(std::isfinite(pb.lse[0]));
    // the same plan with device 0's memory is refused, naming both devices
    Problem other(c, Storage::Packed, rng);
    t = other.tensors();
    CHECK(ringattn_forward(p, &t, nullptr) == RINGATTN_ERR_CUDA);
    CHECK(has(ringattn_last_error(), "got memory of device 0, expected device 1"));
    CHECK(ringattn_plan_destroy(p) == RINGATTN_SUCCESS);
    CHECK((get(&cur) == 0 && cur == 0));
}

TEST_CASE("CUDA: a device fault is RINGATTN_ERR_CUDA with a message, never an abort", "[cuda][errors]")
{
    using inject_fn = void (*)();
    const auto inject = reinterpret_cast<inject_fn>(dlsym(RTLD_DEFAULT, "ra_emu_inject_fault"));
    if (!inject) {
        SUCCEED("faults are injected only on the emulation");
        return;
    }
    const auto reset = runtime<int (*)()>("cudaDeviceReset");
    const auto sync = runtime<int (*)()>("cudaDeviceSynchronize");
    std::mt19937_64 rng(seed_for("cuda fault", 0));
    AttnConfig c = small();
    Problem pb(c, Storage::Packed, rng);
    Plan plan(c);
    require_plan(plan);
    inject(); // the next launch (the call's scan) faults when the stream runs it
    ringattn_tensors_t t = pb.tensors();
    CHECK(ringattn_forward(plan.get(), &t, nullptr) == RINGATTN_SUCCESS); // enqueued, returned
    CHECK(sync() != 0);                                                   // the fault surfaces
    // the same tensors again (a copy to the device would fail now too, as on a GPU)
    CHECK(ringattn_forward(plan.get(), &t, nullptr) == RINGATTN_ERR_CUDA); // and is reported
    INFO(ringattn_last_error());
    CHECK(has(ringattn_last_error(), "ringattn: CUDA: "));
    CHECK(has(ringattn_last_error(), "injected device fault"));
    reset();
    CHECK(check_against_oracle(plan, pb)); // a reset device works again
}
