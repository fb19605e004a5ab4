// Argument validation: each bad input returns its specific status, leaves a message naming the
// function in ringattn_last_error(), and writes nothing (plan pointer, O, LSE, dQ, dK, dV compared
// byte for byte with a copy).
#include <catch2/catch.hpp>

#include <cstddef>

#include <climits>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "support/shim.hpp"

using namespace ratest;

namespace {

// A valid problem whose descriptor each case breaks in one way.
struct Base {
    AttnConfig cfg;
    std::vector<float> bad_alibi;
    Base()
    {
        cfg.H = 4;
        cfg.Hkv = 2;
        cfg.D = 16;
        cfg.Dv = 8;
        cfg.cu_q = {0, 5, 12};
        cfg.cu_k = {0, 6, 12};
        cfg.causal = true;
    }
};

struct DescCase {
    const char *what;
    ringattn_status_t expect;
    std::function<void(ringattn_plan_desc_t &, std::vector<int32_t> &, std::vector<int32_t> &)> edit;
};

bool mentions(const char *fn)
{
    const char *e = ringattn_last_error();
    return e != nullptr && std::strlen(e) > 0 && std::strstr(e, fn) != nullptr;
}

} // namespace

TEST_CASE("plan_create rejects bad descriptors with their specific status", "[validation]")
{
    const ringattn_status_t IA = RINGATTN_ERR_INVALID_ARGUMENT, UN = RINGATTN_ERR_UNSUPPORTED;
    static const float nan_slopes[4] = {0.5f, NAN, 0.125f, 0.0625f};
    const DescCase cases[] = {
        {"struct_size 0", IA, [](auto &d, auto &, auto &) { d.struct_size = 0; }},
        {"struct_size of no release", IA, [](auto &d, auto &, auto &) { d.struct_size = sizeof d / 2; }},
        {"struct_size of a later version", IA, [](auto &d, auto &, auto &) { d.struct_size = sizeof d + 8; }},
        {"num_heads 0", IA, [](auto &d, auto &, auto &) { d.num_heads = 0; }},
        {"num_heads negative", IA, [](auto &d, auto &, auto &) { d.num_heads = -4; }},
        {"num_kv_heads negative", IA, [](auto &d, auto &, auto &) { d.num_kv_heads = -2; }},
        {"H % H_kv != 0", IA, [](auto &d, auto &, auto &) { d.num_kv_heads = 3; }},
        {"H_kv > H", IA, [](auto &d, auto &, auto &) { d.num_kv_heads = 8; }},
        {"head_dim 0", IA, [](auto &d, auto &, auto &) { d.head_dim = 0; }},
        {"head_dim 257", UN, [](auto &d, auto &, auto &) { d.head_dim = 257; }},
        {"head_dim_v 257", UN, [](auto &d, auto &, auto &) { d.head_dim_v = 257; }},
        {"head_dim_v negative", IA, [](auto &d, auto &, auto &) { d.head_dim_v = -1; }},
        {"dtype 3", IA, [](auto &d, auto &, auto &) { d.dtype = (ringattn_dtype_t)3; }},
        {"dtype -1", IA, [](auto &d, auto &, auto &) { d.dtype = (ringattn_dtype_t)-1; }},
        {"layout 3", IA, [](auto &d, auto &, auto &) { d.layout = (ringattn_layout_t)3; }},
        {"num_seqs negative", IA, [](auto &d, auto &, auto &) { d.num_seqs = -1; }},
        {"NULL cu_seqlens", IA, [](auto &d, auto &, auto &) { d.cu_seqlens = nullptr; }},
        {"cu_seqlens[0] != 0", IA, [](auto &d, auto &q, auto &) { q[0] = 1; }},
        {"cu_seqlens decreasing", IA, [](auto &d, auto &q, auto &) { q[1] = 13; }},
        {"cu_seqlens negative entry", IA, [](auto &d, auto &q, auto &) { q[1] = -3; }},
        {"cu_seqlens_k[0] != 0", IA, [](auto &d, auto &, auto &k) { k[0] = 2; }},
        {"cu_seqlens_k negative length", IA, [](auto &d, auto &, auto &k) { k[2] = 4; }},
        {"window_left < -1", IA, [](auto &d, auto &, auto &) { d.window_left = -2; }},
        {"window_right < -1", IA, [](auto &d, auto &, auto &) { d.window_right = -7; }},
        {"softcap < 0", IA, [](auto &d, auto &, auto &) { d.softcap = -1.0f; }},
        {"softcap NaN", IA, [](auto &d, auto &, auto &) { d.softcap = NAN; }},
        {"softcap inf", IA, [](auto &d, auto &, auto &) { d.softcap = INFINITY; }},
        {"scale NaN", IA, [](auto &d, auto &, auto &) { d.softmax_scale = NAN; }},
        {"scale inf", IA, [](auto &d, auto &, auto &) { d.softmax_scale = INFINITY; }},
        {"scale negative", IA, [](auto &d, auto &, auto &) { d.softmax_scale = -0.5f; }},
        {"ALiBi slope NaN", IA, [](auto &d, auto &, auto &) { d.alibi_slopes = nan_slopes; }},
        // dynamic masks (SPEC 6): H = 4, H_kv = 2, so H_b must be 0, 1, 2 or 4
        {"keep_k > 0 without a key bias", IA, [](auto &d, auto &, auto &) { d.keep_k = 4; }},
        {"keep_k negative", IA, [](auto &d, auto &, auto &) { d.keep_k = -1; }},
        {"keep_k negative with a bias", IA, [](auto &d, auto &, auto &) { d.key_bias_heads = 1, d.keep_k = -3; }},
        {"key_bias_heads 3 (not 1, H_kv or H)", IA, [](auto &d, auto &, auto &) { d.key_bias_heads = 3; }},
        {"key_bias_heads 3 with keep_k", IA, [](auto &d, auto &, auto &) { d.key_bias_heads = 3, d.keep_k = 2; }},
        {"key_bias_heads 8 (> H)", IA, [](auto &d, auto &, auto &) { d.key_bias_heads = 8; }},
        {"key_bias_heads negative", IA, [](auto &d, auto &, auto &) { d.key_bias_heads = -1; }},
        {"key_bias_heads INT_MIN", IA, [](auto &d, auto &, auto &) { d.key_bias_heads = INT_MIN; }},
        {"block_q negative", IA, [](auto &d, auto &, auto &) { d.block_q = -1; }},
        {"block_k negative", IA, [](auto &d, auto &, auto &) { d.block_k = -16; }},
        {"num_threads negative", IA, [](auto &d, auto &, auto &) { d.num_threads = -1; }},
        {"precision 2", IA, [](auto &d, auto &, auto &) { d.precision = (ringattn_precision_t)2; }},
        {"precision negative", IA, [](auto &d, auto &, auto &) { d.precision = (ringattn_precision_t)-1; }},
        {"backend 3", IA, [](auto &d, auto &, auto &) { d.backend = (ringattn_backend_t)3; }},
        {"device -2", IA, [](auto &d, auto &, auto &) { d.device = -2; }},
        {"device 1 on the CPU", IA, [](auto &d, auto &, auto &) { d.backend = RINGATTN_BACKEND_CPU, d.device = 1; }},
        {"backend CUDA, not built", UN, [](auto &d, auto &, auto &) { d.backend = RINGATTN_BACKEND_CUDA; }},
    };
    for (const DescCase &dc : cases) {
        if (std::strstr(dc.what, "not built") && library_has_backend("cuda")) continue;
        Base b;
        std::vector<int32_t> cq = b.cfg.cu_q, ck = b.cfg.cu_k;
        ringattn_plan_desc_t d = make_desc(b.cfg);
        d.cu_seqlens = cq.data();
        d.cu_seqlens_k = ck.data();
        dc.edit(d, cq, ck);
        ringattn_plan_t sentinel = reinterpret_cast<ringattn_plan_t>(&b);
        ringattn_plan_t plan = sentinel;
        const ringattn_status_t st = ringattn_plan_create(nullptr, &d, &plan);
        INFO(dc.what << ": got " << ringattn_status_string(st) << " \"" << ringattn_last_error() << "\"");
        CHECK(st == dc.expect);
        CHECK(plan == sentinel);
        CHECK(mentions("ringattn_plan_create"));
        if (st == RINGATTN_SUCCESS && plan != sentinel) ringattn_plan_destroy(plan);
    }
}

TEST_CASE("plan_create: a backend this build lacks names what it lacks", "[validation]")
{
    if (!library_has_backend("cuda")) {
        Base b;
        ringattn_plan_desc_t d = make_desc(b.cfg);
        d.backend = RINGATTN_BACKEND_CUDA;
        ringattn_plan_t plan = nullptr;
        CHECK(ringattn_plan_create(nullptr, &d, &plan) == RINGATTN_ERR_UNSUPPORTED);
        CHECK(plan == nullptr);
        CHECK(std::strstr(ringattn_last_error(), "RINGATTN_ENABLE_CUDA") != nullptr);
    }
    // AUTO and CPU both give the CPU backend (AUTO even where CUDA is built), and get_info says so.
    for (ringattn_backend_t be : {RINGATTN_BACKEND_AUTO, RINGATTN_BACKEND_CPU}) {
        Base b2;
        ringattn_plan_desc_t d2 = make_desc(b2.cfg);
        d2.backend = be;
        ringattn_plan_t p = nullptr;
        REQUIRE(ringattn_plan_create(nullptr, &d2, &p) == RINGATTN_SUCCESS);
        ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
        REQUIRE(ringattn_plan_get_info(p, &info) == RINGATTN_SUCCESS);
        CHECK(info.backend == RINGATTN_BACKEND_CPU);
        CHECK(info.device == -1);
        ringattn_plan_destroy(p);
    }
}

TEST_CASE("plan_create: a 0.3-sized descriptor has no precision field", "[validation][abi]")
{
    // 0.4 appended `precision`: a caller built against 0.3 passes 0.3's struct_size, and
    // whatever lies past it (here an invalid level) is not read: the default applies
    Base b;
    ringattn_plan_desc_t d = make_desc(b.cfg);
    d.precision = (ringattn_precision_t)7;
    ringattn_plan_t p = nullptr;
    CHECK(ringattn_plan_create(nullptr, &d, &p) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(mentions("precision"));
    const size_t v0_3 = (offsetof(ringattn_plan_desc_t, precision) + alignof(ringattn_plan_desc_t) - 1) /
                        alignof(ringattn_plan_desc_t) * alignof(ringattn_plan_desc_t);
    REQUIRE(v0_3 < sizeof d);
    d.struct_size = v0_3;
    REQUIRE(ringattn_plan_create(nullptr, &d, &p) == RINGATTN_SUCCESS);
    ringattn_plan_destroy(p);
}

TEST_CASE("plan_create: NULL pointers and a communicator that was never created", "[validation]")
{
    Base b;
    ringattn_plan_desc_t d = make_desc(b.cfg);
    ringattn_plan_t sentinel = reinterpret_cast<ringattn_plan_t>(&b), plan = sentinel;
    CHECK(ringattn_plan_create(nullptr, nullptr, &plan) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(plan == sentinel);
    CHECK(mentions("ringattn_plan_create"));
    CHECK(ringattn_plan_create(nullptr, &d, nullptr) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(mentions("ringattn_plan_create"));
    // A made-up comm is looked up in the registry of live comms, never dereferenced.
    int dummy = 0;
    const ringattn_status_t st = ringattn_plan_create(reinterpret_cast<ringattn_comm_t>(&dummy), &d, &plan);
    CHECK(st == RINGATTN_ERR_INVALID_USAGE);
    CHECK(plan == sentinel);
    CHECK(mentions("ringattn_plan_create"));
}

TEST_CASE("plan_create accepts the edges of the valid ranges", "[validation]")
{
    // These must not be rejected: they guard the cases above against over-eager checks.
    Base b;
    const std::function<void(AttnConfig &)> edits[] = {
        [](AttnConfig &c) { c.D = 256, c.Dv = 256; },
        [](AttnConfig &c) { c.D = backend_dim(1), c.Dv = backend_dim(1); }, // CUDA: 8
        [](AttnConfig &c) { c.Hkv = 0; },
        [](AttnConfig &c) { c.Hkv = 1; },
        [](AttnConfig &c) { c.wl = 1 << 30, c.wr = 1 << 30, c.causal = false; },
        [](AttnConfig &c) { c.cu_q = {0}, c.cu_k = {0}; },
        [](AttnConfig &c) { c.cu_q = {0, 0, 0}, c.cu_k = {0, 0, 5}; },
        [](AttnConfig &c) { c.block_q = 1, c.block_k = 1; },
        [](AttnConfig &c) { c.block_q = 512, c.block_k = 512; },
        // key bias heads 1, H_kv and H, with and without top-k (SPEC 6)
        [](AttnConfig &c) { c.key_bias_heads = 1; },
        [](AttnConfig &c) { c.key_bias_heads = 2; },
        [](AttnConfig &c) { c.key_bias_heads = 4; },
        [](AttnConfig &c) { c.key_bias_heads = 1, c.keep_k = 1; },
        [](AttnConfig &c) { c.key_bias_heads = 2, c.keep_k = 1 << 30; },
        [](AttnConfig &c) { c.key_bias_heads = 4, c.keep_k = INT_MAX; },
        [](AttnConfig &c) { c.Hkv = 0, c.key_bias_heads = 4, c.keep_k = 3; }, // H_kv = 0 means H
        [](AttnConfig &c) { c.Hkv = 1, c.key_bias_heads = 1, c.keep_k = 3; },
        [](AttnConfig &c) { c.key_bias_heads = 2, c.cu_q = {0}, c.cu_k = {0}; },
    };
    int i = 0;
    for (const auto &e : edits) {
        AttnConfig c = b.cfg;
        e(c);
        Plan p(c);
        INFO("edit " << i++ << ": " << ringattn_last_error());
        CHECK(p.ok());
    }
}

namespace {

// A valid plan plus problem whose outputs hold a known pattern, for the call-time checks.
struct CallFixture {
    Base b;
    std::mt19937_64 rng{seed_for("validation-call", 0)};
    Problem pb{b.cfg, Storage::Packed, rng};
    Plan plan{b.cfg};
    std::vector<unsigned char> o0, dq0, dk0, dv0;
    std::vector<float> lse0;
    CallFixture()
    {
        REQUIRE(plan.ok());
        for (TView *t : {&pb.o, &pb.dq, &pb.dk, &pb.dv})
            for (int64_t r = 0; r < t->T; ++r)
                for (int h = 0; h < t->heads; ++h)
                    for (int c = 0; c < t->dim; ++c) t->set(r, h, c, 0.5 * c - r + h);
        for (size_t i = 0; i < pb.lse.size(); ++i) pb.lse[i] = -1.0f - (float)i;
        o0 = pb.o.buf->bytes;
        dq0 = pb.dq.buf->bytes;
        dk0 = pb.dk.buf->bytes;
        dv0 = pb.dv.buf->bytes;
        lse0 = pb.lse;
    }
    bool untouched() const
    {
        return pb.o.buf->bytes == o0 && pb.dq.buf->bytes == dq0 && pb.dk.buf->bytes == dk0 &&
               pb.dv.buf->bytes == dv0 &&
               std::memcmp(pb.lse.data(), lse0.data(), lse0.size() * sizeof(float)) == 0;
    }
};

struct CallCase {
    const char *what;
    ringattn_status_t expect;
    std::function<void(ringattn_tensors_t &)> edit;
};

} // namespace

TEST_CASE("forward and backward reject bad tensors and leave every output untouched", "[validation]")
{
    const ringattn_status_t IA = RINGATTN_ERR_INVALID_ARGUMENT;
    const CallCase cases[] = {
        {"tensors struct_size 0", IA, [](auto &t) { t.struct_size = 0; }},
        {"tensors struct_size too small", IA, [](auto &t) { t.struct_size = sizeof t / 2; }},
        {"NULL q.data", IA, [](auto &t) { t.q.data = nullptr; }},
        {"NULL k.data", IA, [](auto &t) { t.k.data = nullptr; }},
        {"NULL v.data", IA, [](auto &t) { t.v.data = nullptr; }},
        {"NULL o.data", IA, [](auto &t) { t.o.data = nullptr; }},
        {"NULL lse", IA, [](auto &t) { t.lse = nullptr; }},
        {"negative q row stride", IA, [](auto &t) { t.q.row_stride = -64; }},
        {"negative k head stride", IA, [](auto &t) { t.k.head_stride = -16; }},
        {"q row stride smaller than head_dim", IA, [](auto &t) { t.q.row_stride = 3; }},
        {"v head stride smaller than head_dim_v", IA, [](auto &t) { t.v.head_stride = 2; }},
        {"o rows overlapping (row stride < H * D_v)", IA, [](auto &t) { t.o.row_stride = 8, t.o.head_stride = 8; }},
    };
    for (int pass = 0; pass < 2; ++pass) {
        const char *fn = pass ? "ringattn_backward" : "ringattn_forward";
        for (const CallCase &cc : cases) {
            CallFixture f;
            ringattn_tensors_t t = f.pb.tensors();
            cc.edit(t);
            const ringattn_status_t st = pass ? ringattn_backward(f.plan.get(), &t, nullptr)
                                              : ringattn_forward(f.plan.get(), &t, nullptr);
            f.pb.from_device();
            INFO(fn << ", " << cc.what << ": got " << ringattn_status_string(st) << " \""
                    << ringattn_last_error() << "\"");
            if (pass == 1 && std::strstr(cc.what, "o rows")) {
                // O is an input of the backward: overlapping rows are legal there (broadcast).
                CHECK((st == RINGATTN_SUCCESS || st == IA));
                continue;
            }
            CHECK(st == cc.expect);
            CHECK(mentions(fn));
            CHECK(f.untouched());
        }
    }
    const CallCase bwd_cases[] = {
        {"NULL dout.data", IA, [](auto &t) { t.dout.data = nullptr; }},
        {"NULL dq.data", IA, [](auto &t) { t.dq.data = nullptr; }},
        {"NULL dk.data", IA, [](auto &t) { t.dk.data = nullptr; }},
        {"NULL dv.data", IA, [](auto &t) { t.dv.data = nullptr; }},
        {"dq heads overlapping", IA, [](auto &t) { t.dq.head_stride = 1, t.dq.row_stride = 64; }},
        {"dk rows overlapping", IA, [](auto &t) { t.dk.row_stride = 16; }},
        {"negative dv row stride", IA, [](auto &t) { t.dv.row_stride = -16; }},
    };
    for (const CallCase &cc : bwd_cases) {
        CallFixture f;
        ringattn_tensors_t t = f.pb.tensors();
        cc.edit(t);
        const ringattn_status_t st = ringattn_backward(f.plan.get(), &t, nullptr);
        f.pb.from_device();
        INFO("backward, " << cc.what << ": got " << ringattn_status_string(st) << " \""
                          << ringattn_last_error() << "\"");
        CHECK(st == cc.expect);
        CHECK(mentions("ringattn_backward"));
        CHECK(f.untouched());
    }
}

TEST_CASE("forward and backward: NULL, destroyed and foreign plans, NULL tensors, streams", "[validation]")
{
    for (int pass = 0; pass < 2; ++pass) {
        const char *fn = pass ? "ringattn_backward" : "ringattn_forward";
        auto call = [&](ringattn_plan_t p, const ringattn_tensors_t *t, void *stream) {
            return pass ? ringattn_backward(p, t, stream) : ringattn_forward(p, t, stream);
        };
        INFO(fn);
        CallFixture f;
        ringattn_tensors_t t = f.pb.tensors();
        CHECK(call(nullptr, &t, nullptr) == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(mentions(fn));
        CHECK(call(f.plan.get(), nullptr, nullptr) == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(mentions(fn));
        int stream = 0;
        if (!on_cuda()) { // a stream on the CPU backend (a CUDA stream cannot be told from junk)
            CHECK(call(f.plan.get(), &t, &stream) == RINGATTN_ERR_UNSUPPORTED);
            CHECK(mentions(fn));
        }
        // A pointer that never was a plan: refused from the registry, never dereferenced.
        CHECK(call(reinterpret_cast<ringattn_plan_t>(&stream), &t, nullptr) == RINGATTN_ERR_INVALID_USAGE);
        CHECK(mentions(fn));
        // A destroyed plan (under ASan this would be a use after free if it were dereferenced).
        Plan dead(f.b.cfg);
        REQUIRE(dead.ok());
        ringattn_plan_t stale = dead.get();
        dead.reset();
        CHECK(call(stale, &t, nullptr) == RINGATTN_ERR_INVALID_USAGE);
        CHECK(mentions(fn));
        CHECK(f.untouched());
    }
}

TEST_CASE("plan_destroy: NULL is a no-op, twice is an error", "[validation]")
{
    CHECK(ringattn_plan_destroy(nullptr) == RINGATTN_SUCCESS);
    Base b;
    ringattn_plan_desc_t d = make_desc(b.cfg);
    ringattn_plan_t p = nullptr;
    REQUIRE(ringattn_plan_create(nullptr, &d, &p) == RINGATTN_SUCCESS);
    REQUIRE(p != nullptr);
    CHECK(ringattn_plan_destroy(p) == RINGATTN_SUCCESS);
    CHECK(ringattn_plan_destroy(p) == RINGATTN_ERR_INVALID_USAGE);
    CHECK(mentions("ringattn_plan_destroy"));
}

TEST_CASE("the plan copies its descriptor: later edits to the caller's arrays change nothing", "[validation]")
{
    Base b;
    b.cfg.alibi = alibi_slopes(b.cfg.H);
    std::mt19937_64 rng(seed_for("validation-copy", 0));
    AttnConfig c = b.cfg;
    Problem pb(c, Storage::Packed, rng);
    Plan plan(c);
    REQUIRE(plan.ok());
    // Scribble over the arrays the descriptor pointed to; the plan must have its own copies.
    for (auto &x : c.cu_q) x = -1;
    for (auto &x : c.cu_k) x = 1000;
    for (auto &x : c.alibi) x = NAN;
    pb.cfg = b.cfg;
    check_against_oracle(plan, pb);
}

TEST_CASE("last_error is per thread", "[validation]")
{
    ringattn_plan_t p = nullptr;
    REQUIRE(ringattn_plan_create(nullptr, nullptr, &p) == RINGATTN_ERR_INVALID_ARGUMENT);
    const std::string mine = ringattn_last_error();
    REQUIRE(!mine.empty());
    std::string theirs;
    std::thread th([&] {
        theirs = ringattn_last_error(); // nothing failed on this thread yet
        ringattn_plan_destroy(reinterpret_cast<ringattn_plan_t>(&p));
    });
    th.join();
    CHECK(theirs.empty());
    CHECK(std::string(ringattn_last_error()) == mine);
}

TEST_CASE("merge_partials: num_partials < 1 and a NULL partial LSE", "[validation][merge]")
{
    // (test_merge covers every merge argument; these two are the validation list's.)
    const int64_t T = 3;
    const int H = 2, Dv = 4;
    std::vector<float> o0((size_t)(T * H * Dv), 1.0f), o1 = o0, out((size_t)(T * H * Dv), 7.0f);
    std::vector<float> l0((size_t)(T * H), 0.5f), l1 = l0, out_lse((size_t)(T * H), 9.0f);
    const std::vector<float> out_before = out, lse_before = out_lse;
    ringattn_tensor_t parts[2] = {{o0.data(), 0, 0}, {o1.data(), 0, 0}};
    ringattn_tensor_t dst = {out.data(), 0, 0};
    const float *lses[2] = {l0.data(), l1.data()};
    const float *lses_null[2] = {l0.data(), nullptr};
    for (int n : {0, -1}) {
        INFO("num_partials " << n);
        CHECK(ringattn_merge_partials(n, T, H, Dv, RINGATTN_FLOAT32, parts, lses, dst, out_lse.data()) ==
              RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(mentions("ringattn_merge_partials"));
    }
    CHECK(ringattn_merge_partials(2, T, H, Dv, RINGATTN_FLOAT32, parts, lses_null, dst, out_lse.data()) ==
          RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(mentions("ringattn_merge_partials"));
    CHECK(out == out_before);
    CHECK(std::memcmp(out_lse.data(), lse_before.data(), lse_before.size() * sizeof(float)) == 0);
    // and the same arguments with both LSEs succeed (the failures above are the ones tested)
    CHECK(ringattn_merge_partials(2, T, H, Dv, RINGATTN_FLOAT32, parts, lses, dst, out_lse.data()) ==
          RINGATTN_SUCCESS);
    CHECK(out[0] == 1.0f);
    CHECK(out_lse[0] == Approx(0.5 + std::log(2.0)).epsilon(1e-6));
}

TEST_CASE("dynamic masks: a NULL key_bias, or a NaN or +inf in it, is refused, outputs untouched", "[validation][dynamic]")
{
    // A plan with H_b = 2 and keep_k = 3; the call-time checks are that tensors.key_bias is
    // given and holds no NaN or +inf (SPEC 6: -inf is a key no row uses), forward and backward;
    // dbias = NULL is legal (not wanted).
    Base b;
    b.cfg.key_bias_heads = 2;
    b.cfg.keep_k = 3;
    std::mt19937_64 rng(seed_for("validation-bias", 0));
    const float bad_values[] = {0.0f /* unused: NULL */, std::nanf(""), INFINITY};
    for (int bad = 0; bad < 3; ++bad)
        for (int pass = 0; pass < 2; ++pass)
            for (int with_dbias = 0; with_dbias < 2; ++with_dbias) {
                const char *fn = pass ? "ringattn_backward" : "ringattn_forward";
                Problem pb(b.cfg, Storage::Packed, rng);
                Plan plan(b.cfg);
                INFO("plan_create: " << ringattn_last_error());
                REQUIRE(plan.ok());
                if (pass) // a valid forward first: the backward needs O and LSE
                    REQUIRE(run_forward(plan, pb) == RINGATTN_SUCCESS);
                for (TView *t : {&pb.dq, &pb.dk, &pb.dv})
                    for (int64_t r = 0; r < t->T; ++r)
                        for (int h = 0; h < t->heads; ++h)
                            for (int c = 0; c < t->dim; ++c) t->set(r, h, c, 0.25 * c - r + h);
                for (size_t i = 0; i < pb.dbias_buf.size(); ++i) pb.dbias_buf[i] = 3.0f + (float)i;
                if (!pass)
                    for (size_t i = 0; i < pb.lse.size(); ++i) pb.lse[i] = -1.0f - (float)i;
                const std::vector<unsigned char> o0 = pb.o.buf->bytes, dq0 = pb.dq.buf->bytes,
                                                 dk0 = pb.dk.buf->bytes, dv0 = pb.dv.buf->bytes;
                const std::vector<float> lse0 = pb.lse, db0 = pb.dbias_buf;
                ringattn_tensors_t t = pb.tensors();
                Mirrored<float> poisoned;
                poisoned.host = pb.bias_buf;
                const size_t at = (size_t)(rng() % pb.bias_elems());
                poisoned.host[at] = bad_values[bad];
                t.key_bias = bad ? poisoned.bind() : nullptr;
                if (!with_dbias) t.dbias = nullptr;
                const ringattn_status_t st = pass ? ringattn_backward(plan.get(), &t, nullptr)
                                                  : ringattn_forward(plan.get(), &t, nullptr);
                pb.from_device();
                INFO(fn << ", bad " << bad << ", dbias " << (with_dbias ? "given" : "NULL") << ": got "
                        << ringattn_status_string(st) << " \"" << ringattn_last_error() << "\"");
                CHECK(st == RINGATTN_ERR_INVALID_ARGUMENT);
                CHECK(mentions(fn));
                CHECK(mentions("key_bias"));
                if (bad) { // names the entry: key_bias[hb, t]
                    const int64_t Tk = b.cfg.Tk();
                    CHECK(mentions(("key_bias[" + std::to_string(at / (size_t)Tk) + ", " +
                                    std::to_string(at % (size_t)Tk) + "]").c_str()));
                }
                CHECK(pb.o.buf->bytes == o0);
                CHECK(pb.dq.buf->bytes == dq0);
                CHECK(pb.dk.buf->bytes == dk0);
                CHECK(pb.dv.buf->bytes == dv0);
                CHECK(std::memcmp(pb.lse.data(), lse0.data(), lse0.size() * sizeof(float)) == 0);
                CHECK(std::memcmp(pb.dbias_buf.data(), db0.data(), db0.size() * sizeof(float)) == 0);
                // the same call with the bias given succeeds (the NULL is what was refused)
                t.key_bias = pb.bias_device();
                CHECK((pass ? ringattn_backward(plan.get(), &t, nullptr) : ringattn_forward(plan.get(), &t, nullptr)) ==
                      RINGATTN_SUCCESS);
            }
}
