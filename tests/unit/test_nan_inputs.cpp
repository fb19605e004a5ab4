// SPEC 9: NaN in an input propagates to the rows it touches and is never turned into a number
// (issue 28, finding 5: a query row of NaN came out as an empty row, O = 0, LSE = -inf, dQ = 0,
// because the row max `s > m ? s : m` never picks a NaN). On the backend under test (CPU, and
// CUDA on the emulation: <test>_cuda_emu), every dtype, without a mask, causal, and a window; a
// query row of NaN in one head, a key row of NaN, and the merge of partials with a NaN one.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "ringattn.h"
#include "support/shim.hpp"

using namespace ratest;

namespace {

AttnConfig config(ringattn_dtype_t dt, int mask)
{
    AttnConfig c;
    c.dtype = dt, c.H = 2, c.Hkv = 1, c.D = 32;
    c.cu_q = {0, 70, 130};
    c.causal = mask >= 1;
    if (mask == 2) c.wl = 9;
    return c;
}

bool all_nan(const TView &v, int64_t t, int h)
{
    for (int c = 0; c < v.dim; ++c)
        if (!std::isnan(v.get(t, h, c))) return false;
    return true;
}

// Rows of v that hold a NaN, as "t/h" pairs.
std::vector<std::pair<int64_t, int>> nan_rows(const TView &v)
{
    std::vector<std::pair<int64_t, int>> rows;
    for (int64_t t = 0; t < v.T; ++t)
        for (int h = 0; h < v.heads; ++h)
            for (int c = 0; c < v.dim; ++c)
                if (std::isnan(v.get(t, h, c))) {
                    rows.push_back({t, h});
                    break;
                }
    return rows;
}

const char *mask_name(int m) { return m == 0 ? "none" : m == 1 ? "causal" : "causal window 9"; }

} // namespace

TEST_CASE("a query row of NaN gives a NaN row (O, LSE, dQ), every other row finite",
          "[nan][spec]")
{
    uint64_t seed = 2800;
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_FLOAT16, RINGATTN_BFLOAT16})
        for (int mask : {0, 1, 2}) {
            const AttnConfig c = config(dt, mask);
            INFO("dtype " << (int)dt << ", mask " << mask_name(mask));
            std::mt19937_64 rng(++seed);
            Problem pb(c, Storage::Packed, rng);
            // row 90 (the second sequence's 21st query) of head 1: one NaN element is enough
            pb.q.set_nan(90, 1, 3);
            Plan plan(c);
            REQUIRE(plan.ok());
            pb.poison_forward_outputs();
            REQUIRE(run_forward(plan, pb) == RINGATTN_SUCCESS);
            CHECK(all_nan(pb.o, 90, 1));
            CHECK(std::isnan(pb.lse[(size_t)1 * c.Tq() + 90]));
            const auto o_rows = nan_rows(pb.o);
            CHECK(o_rows.size() == 1); // no other row touched
            for (size_t i = 0; i < pb.lse.size(); ++i)
                if (i != (size_t)1 * c.Tq() + 90) CHECK_FALSE(std::isnan(pb.lse[i]));
            pb.poison_backward_outputs();
            REQUIRE(run_backward(plan, pb) == RINGATTN_SUCCESS);
            CHECK(all_nan(pb.dq, 90, 1));
            const auto dq_rows = nan_rows(pb.dq);
            CHECK(dq_rows.size() == 1); // dQ of the other rows: their own P, finite K
        }
}

TEST_CASE("a key row of NaN gives NaN in exactly the rows that may attend it", "[nan][spec]")
{
    uint64_t seed = 2900;
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16})
        for (int mask : {1, 2}) {
            const AttnConfig c = config(dt, mask);
            INFO("dtype " << (int)dt << ", mask " << mask_name(mask));
            std::mt19937_64 rng(++seed);
            Problem pb(c, Storage::Packed, rng);
            pb.k.set_nan(100, 0, 5); // key 30 of the second sequence
            Plan plan(c);
            REQUIRE(plan.ok());
            pb.poison_forward_outputs();
            REQUIRE(run_forward(plan, pb) == RINGATTN_SUCCESS);
            for (int64_t t = 70; t < 130; ++t)
                for (int h = 0; h < 2; ++h) {
                    const bool sees = t >= 100 && (mask == 1 || t - 100 <= 9);
                    INFO("row " << t << " head " << h);
                    CHECK(all_nan(pb.o, t, h) == sees);
                }
            for (int64_t t = 0; t < 70; ++t) CHECK_FALSE(std::isnan(pb.o.get(t, 0, 0)));
        }
}

TEST_CASE("merging partials: a NaN partial makes the row NaN, an empty one is skipped",
          "[nan][merge]")
{
    const int T = 3, H = 1, Dv = 2;
    std::vector<float> o0 = {1, 2, 3, 4, 5, 6}, o1 = {NAN, 0, 7, 8, 9, 10};
    std::vector<float> l0 = {0.5f, 0.25f, -INFINITY}, l1 = {NAN, 1.0f, 2.0f};
    const float *lses[2] = {l0.data(), l1.data()};
    ringattn_tensor_t parts[2] = {{o0.data(), 0, 0}, {o1.data(), 0, 0}};
    std::vector<float> out((size_t)T * H * Dv, -7.0f), out_lse((size_t)T, -7.0f);
    const ringattn_tensor_t o = {out.data(), 0, 0};
    REQUIRE(ringattn_merge_partials(2, T, H, Dv, RINGATTN_FLOAT32, parts, lses, o, out_lse.data()) ==
            RINGATTN_SUCCESS);
    CHECK(std::isnan(out[0]));
    CHECK(std::isnan(out[1]));
    CHECK(std::isnan(out_lse[0]));
    for (int i = 2; i < 6; ++i) CHECK(std::isfinite(out[(size_t)i]));
    CHECK(out[4] == 9.0f); // row 2: partial 0 empty, partial 1 alone
    CHECK(out_lse[2] == 2.0f);
}
