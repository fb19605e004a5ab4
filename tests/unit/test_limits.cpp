// The library's limits and its arithmetic at them: strides whose offsets do not fit the BLAS's
// int or int64 at all, descriptor values that would make the logits overflow or NaN (SPEC 2,
// SPEC 9), num_seqs at INT32_MAX, and ringattn_last_error() after successful helper calls.
// Every refusal names the argument, returns its specific status and writes nothing.
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "support/cases.hpp"
#include "support/device.hpp"
#include "support/shim.hpp"

using namespace ratest;

namespace {

bool error_mentions(std::initializer_list<const char *> words)
{
    const std::string e = ringattn_last_error();
    INFO("ringattn_last_error(): " << e);
    bool all = !e.empty();
    for (const char *w : words) all = all && e.find(w) != std::string::npos;
    return all;
}

// One sequence of T tokens, H = H_kv heads of D = D_v, float32, no mask.
AttnConfig tiny_config(int T, int H = 1)
{
    AttnConfig c;
    c.H = H;
    c.D = 16;
    c.cu_q = {0, T};
    return c;
}

// Address space reserved without memory (PROT_NONE): only the pages made accessible exist.
struct Reservation {
    char *base = nullptr;
    size_t bytes = 0;
    explicit Reservation(size_t n) : bytes(n)
    {
        void *p = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        base = p == MAP_FAILED ? nullptr : static_cast<char *>(p);
    }
    ~Reservation()
    {
        if (base) munmap(base, bytes);
    }
    // Makes [at, at + n) readable and writable (whole pages).
    bool open(size_t at, size_t n)
    {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE), lo = at / page * page;
        return mprotect(base + lo, (at + n - lo + page - 1) / page * page, PROT_READ | PROT_WRITE) == 0;
    }
};

struct Packed {
    std::vector<float> q, k, v, o, lse, dout, dq, dk, dv;
    Packed(int T, int H, int D)
        : q((size_t)T * H * D), k(q.size()), v(q.size()), o(q.size(), -7.0f), lse((size_t)H * T, -7.0f),
          dout(q.size(), 0.5f), dq(q.size(), -7.0f), dk(q.size(), -7.0f), dv(q.size(), -7.0f)
    {
        for (size_t i = 0; i < q.size(); ++i) {
            q[i] = (float)((i * 37) % 11) / 4.0f - 1.0f;
            k[i] = (float)((i * 13) % 7) / 3.0f - 1.0f;
            v[i] = (float)((i * 29) % 17) / 8.0f - 1.0f;
        }
    }
    ringattn_tensors_t tensors()
    {
        ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
        t.q.data = q.data(), t.k.data = k.data(), t.v.data = v.data(), t.o.data = o.data();
        t.lse = lse.data(), t.dout.data = dout.data(), t.dq.data = dq.data();
        t.dk.data = dk.data(), t.dv.data = dv.data();
        return t;
    }
};

const int64_t BIG_ROW_STRIDE = ((int64_t)1 << 32) + 32; // (int) of it is 32: a valid-looking lda

} // namespace

TEST_CASE("a row stride above INT32_MAX elements is refused before any memory is read", "[limits][stride]")
{
    if (!device_memory().is_host()) {
        SUCCEED("host memory only");
        return;
    }
    // Q's two rows sit 2^32 + 32 floats apart in a reservation of 16 GiB of address space (no
    // memory): row 0 and row 1 are the only pages that exist. The CPU backend passes the row
    // stride to sgemm as its int lda, which would read row 1 at 32 floats (junk) instead.
    const int T = 2, D = 16;
    const size_t row1 = (size_t)BIG_ROW_STRIDE * sizeof(float);
    Reservation r(row1 + 4096);
    if (!r.base) {
        WARN("no 16 GiB of address space (ulimit -v?): skipped");
        return;
    }
    REQUIRE(r.open(0, 64 * sizeof(float)));
    REQUIRE(r.open(row1, D * sizeof(float)));
    AttnConfig c = tiny_config(T);
    Packed ref(T, 1, D), got(T, 1, D);
    float *q = reinterpret_cast<float *>(r.base);
    for (int i = 0; i < D; ++i) {
        q[i] = ref.q[(size_t)i];
        q[BIG_ROW_STRIDE + i] = ref.q[(size_t)(D + i)];
        q[32 + i] = 3.0f; // what an int lda of 32 would read as row 1
    }
    Plan plan(c);
    require_plan(plan);
    ringattn_tensors_t tr = ref.tensors();
    REQUIRE(ringattn_forward(plan.get(), &tr, nullptr) == RINGATTN_SUCCESS);

    ringattn_tensors_t t = got.tensors();
    t.q.data = q;
    t.q.row_stride = BIG_ROW_STRIDE;
    const ringattn_status_t st = ringattn_forward(plan.get(), &t, nullptr);
    if (st == RINGATTN_SUCCESS) { // accepted: then it must at least be right
        CHECK(got.o == ref.o);
        CHECK(got.lse == ref.lse);
    }
    CHECK(st == RINGATTN_ERR_UNSUPPORTED);
    CHECK(error_mentions({"ringattn_forward", "q", "row", "4294967328", "2147483647"}));
    if (st != RINGATTN_SUCCESS) { // nothing written
        CHECK(std::all_of(got.o.begin(), got.o.end(), [](float x) { return x == -7.0f; }));
        CHECK(std::all_of(got.lse.begin(), got.lse.end(), [](float x) { return x == -7.0f; }));
    }
}

TEST_CASE("every tensor argument takes the row stride limit", "[limits][stride]")
{
    // Refused at argument checking: the data pointers lead to no memory at all.
    Reservation r((size_t)1 << 20);
    REQUIRE(r.base);
    const int T = 2, D = 16;
    AttnConfig c = tiny_config(T);
    Plan plan(c);
    require_plan(plan);
    Packed p(T, 1, D);
    const Packed before = p;
    const char *names[] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};
    for (int which = 0; which < 8; ++which) {
        ringattn_tensors_t t = p.tensors();
        ringattn_tensor_t *x[] = {&t.q, &t.k, &t.v, &t.o, &t.dout, &t.dq, &t.dk, &t.dv};
        x[which]->data = r.base;
        x[which]->row_stride = (int64_t)INT32_MAX + 1;
        INFO("tensor " << names[which]);
        const bool fwd = which < 4;
        const ringattn_status_t st =
            fwd ? ringattn_forward(plan.get(), &t, nullptr) : ringattn_backward(plan.get(), &t, nullptr);
        CHECK(st == RINGATTN_ERR_UNSUPPORTED);
        CHECK(error_mentions({names[which], "row", "2147483648"}));
    }
    CHECK(p.o == before.o);
    CHECK(p.lse == before.lse);
    CHECK(p.dq == before.dq);
    CHECK(p.dk == before.dk);
    CHECK(p.dv == before.dv);
    // INT32_MAX itself passes the checks: asked through a plan of no tokens, whose tensors are
    // never read (this test has no memory behind them).
    AttnConfig empty = tiny_config(0);
    Plan none(empty);
    require_plan(none);
    ringattn_tensors_t t = p.tensors();
    t.q.data = r.base;
    t.q.row_stride = INT32_MAX;
    CHECK(ringattn_forward(none.get(), &t, nullptr) == RINGATTN_SUCCESS);
}

TEST_CASE("strides whose extent overflows int64 are refused naming the tensor", "[limits][stride]")
{
    if (!device_memory().is_host()) {
        SUCCEED("host memory only");
        return;
    }
    // H = 2 with Q's head stride 2^62 elements: head 1 would be 2^64 bytes away, which wraps to
    // head 0's own address in 64-bit arithmetic (no tensor is that large).
    const int T = 3, H = 2, D = 16;
    AttnConfig c = tiny_config(T, H);
    Plan plan(c);
    require_plan(plan);
    Packed p(T, H, D);
    const Packed before = p;
    ringattn_tensors_t t = p.tensors();
    t.q.head_stride = (int64_t)1 << 62;
    t.q.row_stride = H * D;
    ringattn_status_t st = ringattn_forward(plan.get(), &t, nullptr);
    CHECK(st == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(error_mentions({"ringattn_forward", "q", "4611686018427387904"}));
    CHECK(p.o == before.o);
    CHECK(p.lse == before.lse);
}

TEST_CASE("merge and scatter refuse strides whose extent overflows int64", "[limits][stride]")
{
    const int T = 3, H = 2, D = 16;
    AttnConfig c = tiny_config(T, H);
    Plan plan(c);
    require_plan(plan);
    Packed p(T, H, D);
    const Packed before = p;
    // merge: a partial whose last element lies past INT64_MAX bytes
    const float *lses[2] = {p.lse.data(), p.lse.data()};
    ringattn_tensor_t parts[2] = {{p.q.data(), 0, 0}, {p.k.data(), INT64_MAX / 2, 0}};
    ringattn_tensor_t out = {p.o.data(), 0, 0};
    ringattn_status_t st = ringattn_merge_partials(2, T, H, D, RINGATTN_FLOAT32, parts, lses, out, p.lse.data());
    CHECK(st == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(error_mentions({"ringattn_merge_partials", "parts_o[1]"}));
    CHECK(p.o == before.o);
    CHECK(p.lse == before.lse);

    // scatter: a global tensor of three rows INT64_MAX / 4 apart (float16: 2 bytes each)
    ringattn_tensor_t g = {p.q.data(), INT64_MAX / 4, 0}, l = {p.o.data(), 0, 0};
    st = ringattn_plan_scatter(plan.get(), RINGATTN_FLOAT16, 1, 8, g, l);
    CHECK(st == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(error_mentions({"ringattn_plan_scatter", "global"}));
    CHECK(p.o == before.o);
}

TEST_CASE("an output whose strides overflow int64 is refused without overflowing", "[limits][stride]")
{
    // The output overlap check itself multiplies strides: it must not overflow either (UBSan).
    const int T = 4, H = 3, D = 16;
    AttnConfig c = tiny_config(T, H);
    Plan plan(c);
    require_plan(plan);
    Packed p(T, H, D);
    const Packed before = p;
    ringattn_tensors_t t = p.tensors();
    t.o.row_stride = H * D;
    t.o.head_stride = INT64_MAX / 2 + 1; // (H - 1) * head_stride overflows
    CHECK(ringattn_forward(plan.get(), &t, nullptr) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(error_mentions({"ringattn_forward", "o"}));
    t = p.tensors();
    t.dq.row_stride = INT64_MAX / 3; // (T - 1) * row_stride overflows
    CHECK(ringattn_backward(plan.get(), &t, nullptr) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(error_mentions({"ringattn_backward", "dq"}));
    CHECK(p.o == before.o);
    CHECK(p.dq == before.dq);
}

TEST_CASE("descriptor values that make the logits overflow or NaN are refused", "[limits][logits]")
{
    struct Case {
        const char *what;
        float softcap, scale, slope;
        bool ok;
        const char *field;
    };
    const Case cases[] = {
        {"subnormal softcap", 1e-40f, 0.0f, 0.0f, false, "softcap"},
        {"smallest normal softcap", FLT_MIN, 0.0f, 0.0f, true, ""},
        {"largest softcap", FLT_MAX, 0.0f, 0.0f, true, ""},
        {"softmax_scale 3e38", 0.0f, 3e38f, 0.0f, false, "softmax_scale"},
        {"softmax_scale 1e30 (SPEC 10 case 4)", 0.0f, 1e30f, 0.0f, true, ""},
        {"subnormal softmax_scale", 0.0f, 1e-44f, 0.0f, true, ""},
        {"ALiBi slope 1e38", 0.0f, 0.0f, 1e38f, false, "alibi_slopes[1]"},
        {"ALiBi slope -1e38", 0.0f, 0.0f, -1e38f, false, "alibi_slopes[1]"},
        {"ALiBi slope 1e30", 0.0f, 0.0f, 1e30f, true, ""},
    };
    const int T = 40, H = 2;
    for (const Case &k : cases) {
        INFO(k.what);
        AttnConfig c = tiny_config(T, H);
        c.cu_q = {0, 8, T};
        c.softcap = k.softcap;
        c.scale = k.scale;
        if (k.slope != 0.0f) c.alibi = {0.5f, k.slope};
        Plan plan(c);
        if (k.ok) {
            CHECK(plan.ok());
            continue;
        }
        CHECK(plan.status() == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(error_mentions({"ringattn_plan_create", k.field}));
        if (plan.ok()) { // accepted: its outputs are then at least numbers (they were O = 0)
            Packed p(T, H, 16);
            ringattn_tensors_t t = p.tensors();
            REQUIRE(ringattn_forward(plan.get(), &t, nullptr) == RINGATTN_SUCCESS);
            CHECK(std::all_of(p.lse.begin(), p.lse.end(), [](float x) { return std::isfinite(x); }));
        }
    }
    // The ALiBi bound is the longest distance of the batch: slope 1e37 passes at T = 3 ...
    AttnConfig c = tiny_config(3, 2);
    c.alibi = {1e37f, 0.5f};
    Plan short_seq(c);
    CHECK(short_seq.ok());
    // ... and is refused at T = 40 (39 * 1e37 > FLT_MAX / 2), with the distance in the message.
    c = tiny_config(40, 2);
    c.alibi = {1e37f, 0.5f};
    Plan long_seq(c);
    CHECK(long_seq.status() == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(error_mentions({"alibi_slopes[0]", "39"}));
    // cu_seqlens_k longer than the queries: the distance reaches L_k - 1.
    c = tiny_config(3, 2);
    c.cu_k = {0, 40};
    c.alibi = {1e37f, 0.5f};
    Plan long_k(c);
    CHECK(long_k.status() == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(error_mentions({"alibi_slopes[0]", "39"}));
}

TEST_CASE("num_seqs = INT32_MAX is refused: num_seqs + 1 entries do not fit int32", "[limits][num_seqs]")
{
    AttnConfig c = tiny_config(4);
    ringattn_plan_desc_t d = make_desc(c);
    const int32_t cu[3] = {0, 4, 0}; // a caller bug: num_seqs far past the array
    d.cu_seqlens = cu;
    d.num_seqs = INT32_MAX;
    ringattn_plan_t plan = nullptr;
    CHECK(ringattn_plan_create(nullptr, &d, &plan) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(plan == nullptr);
    CHECK(error_mentions({"num_seqs", "2147483647", "2147483646"}));
    d.cu_seqlens = nullptr;
    CHECK(ringattn_plan_create(nullptr, &d, &plan) == RINGATTN_ERR_INVALID_ARGUMENT);
    CHECK(plan == nullptr);
    CHECK(error_mentions({"num_seqs"}));
    CHECK(std::string(ringattn_last_error()).find("-2147483648") == std::string::npos);
}

TEST_CASE("successful helper calls clear ringattn_last_error()", "[limits][errors]")
{
    const int T = 6, H = 2, D = 16;
    AttnConfig c = tiny_config(T, H);
    Plan plan(c);
    require_plan(plan);
    std::vector<float> g((size_t)T * H * D, 1.0f), l(g.size());
    std::vector<int32_t> idx(T);
    auto provoke = [] {
        ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
        REQUIRE(ringattn_plan_get_info(nullptr, &info) == RINGATTN_ERR_INVALID_ARGUMENT);
        REQUIRE(std::strlen(ringattn_last_error()) > 0);
    };
    int64_t n = 0;
    provoke();
    CHECK(ringattn_plan_local_tokens(plan.get(), &n, idx.data()) == RINGATTN_SUCCESS);
    CHECK(std::string(ringattn_last_error()) == "");
    provoke();
    CHECK(ringattn_plan_scatter(plan.get(), RINGATTN_FLOAT32, H, D, {g.data(), 0, 0}, {l.data(), 0, 0}) ==
          RINGATTN_SUCCESS);
    CHECK(std::string(ringattn_last_error()) == "");
    provoke();
    CHECK(ringattn_plan_gather(plan.get(), RINGATTN_FLOAT32, H, D, {l.data(), 0, 0}, {g.data(), 0, 0}) ==
          RINGATTN_SUCCESS);
    CHECK(std::string(ringattn_last_error()) == "");
    provoke();
    ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
    CHECK(ringattn_plan_get_info(plan.get(), &info) == RINGATTN_SUCCESS);
    CHECK(std::string(ringattn_last_error()) == "");
}
