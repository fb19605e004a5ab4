// SPEC 10 cases 1-4 and 7 through the public API, against the float64 oracle.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "support/cases.hpp"

using namespace ratest;

namespace {

bool any_nan(const TView &v)
{
    for (int64_t t = 0; t < v.T; ++t)
        for (int h = 0; h < v.heads; ++h)
            for (int c = 0; c < v.dim; ++c)
                if (std::isnan(v.get(t, h, c))) return true;
    return false;
}

} // namespace

TEST_CASE("SPEC 10 case 1: decode against a 700-slot KV cache, window (59, 0), 512-key blocks", "[spec][case1]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int Hkv : {1, 2}) {
            std::mt19937_64 rng(seed_for("case1", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 4;
            c.Hkv = Hkv;
            c.D = 64;
            c.Dv = 32;
            c.cu_q = {0, 1};
            c.cu_k = {0, 576};
            c.causal = true;
            c.wl = 59;
            c.block_k = 512;
            INFO("config: " << c.describe());
            Problem pb(c, Storage::Packed, rng);
            // 700-slot K/V (and dK/dV) buffers; slots 576..699 stay NaN and must never be read
            // (nor written).
            pb.k = make_packed(dt, 700, Hkv, c.D);
            pb.v = make_packed(dt, 700, Hkv, c.Dv);
            pb.dk = make_packed(dt, 700, Hkv, c.D);
            pb.dv = make_packed(dt, 700, Hkv, c.Dv);
            for (TView *t : {&pb.k, &pb.v, &pb.dk, &pb.dv}) t->T = 576;
            fill_normal(pb.k, rng);
            fill_normal(pb.v, rng);
            Plan plan(c);
            require_plan(plan);
            // Everything of check_against_oracle: no NaN, oracle match, padding (slots 576..699
            // of dK/dV) untouched, empty-row rules.
            REQUIRE(check_against_oracle(plan, pb));

            // Exactly keys 516..575 contribute: an unmasked oracle over those 60 keys alone
            // (their positions keep the query at the end: delta = 59, no window needed).
            AttnConfig c60 = c;
            c60.cu_k = {0, 60};
            c60.causal = false;
            c60.wl = -1;
            Dense K60(60, Hkv, c.D), V60(60, Hkv, c.Dv);
            for (int j = 0; j < 60; ++j)
                for (int h = 0; h < Hkv; ++h) {
                    for (int cc = 0; cc < c.D; ++cc) K60.at(j, h, cc) = pb.k.get(516 + j, h, cc);
                    for (int cc = 0; cc < c.Dv; ++cc) V60.at(j, h, cc) = pb.v.get(516 + j, h, cc);
                }
            const Dense Q = pb.q.to_dense();
            const FwdResult r60 = oracle_forward(c60, Q, K60, V60);
            pb.poison_forward_outputs();
            REQUIRE(run_forward(plan, pb) == RINGATTN_SUCCESS);
            Got got;
            got.O = pb.o.to_dense();
            got.lse = pb.lse_d();
            Spec9Options fwd_only;
            fwd_only.backward = false;
            fwd_only.label = "the 60 keys alone";
            CHECK(spec9_check(c60, Q, K60, V60, Dense(), got, fwd_only));

            // Changing keys outside 516..575 (K and V) changes nothing, bitwise.
            std::vector<uint64_t> o_bits;
            for (int h = 0; h < c.H; ++h)
                for (int cc = 0; cc < c.Dv; ++cc) o_bits.push_back(pb.o.bits(0, h, cc));
            const std::vector<float> lse_before = pb.lse;
            std::normal_distribution<double> nd(0.0, 10.0);
            for (int j : {0, 1, 100, 511, 512, 513, 515})
                for (int h = 0; h < Hkv; ++h) {
                    for (int cc = 0; cc < c.D; ++cc) pb.k.set(j, h, cc, nd(rng));
                    for (int cc = 0; cc < c.Dv; ++cc) pb.v.set(j, h, cc, nd(rng));
                }
            pb.poison_forward_outputs();
            REQUIRE(run_forward(plan, pb) == RINGATTN_SUCCESS);
            size_t i = 0;
            bool same = true;
            for (int h = 0; h < c.H; ++h)
                for (int cc = 0; cc < c.Dv; ++cc) same = same && pb.o.bits(0, h, cc) == o_bits[i++];
            CHECK(same);
            CHECK(std::memcmp(lse_before.data(), pb.lse.data(), lse_before.size() * sizeof(float)) == 0);

            // Backward: keys 0..515 get exactly zero gradients.
            pb.poison_backward_outputs();
            REQUIRE(run_backward(plan, pb) == RINGATTN_SUCCESS);
            bool zero = true;
            for (int j = 0; j < 516; ++j)
                for (int h = 0; h < Hkv; ++h) {
                    for (int cc = 0; cc < c.D; ++cc) zero = zero && pb.dk.get(j, h, cc) == 0.0;
                    for (int cc = 0; cc < c.Dv; ++cc) zero = zero && pb.dv.get(j, h, cc) == 0.0;
                }
            CHECK(zero);
        }
}

TEST_CASE("SPEC 10 case 2: band mask causal + (9, 0) at lengths 600 and 640", "[spec][case2]")
{
    int idx = 0;
    for (const std::vector<int> &lens : {std::vector<int>{600}, std::vector<int>{640}, std::vector<int>{600, 640}})
        for (int b : {32, 64, 256, 512}) {
            std::mt19937_64 rng(seed_for("case2", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = idx % 4 == 3 ? RINGATTN_BFLOAT16 : RINGATTN_FLOAT32;
            c.H = 2;
            c.Hkv = 1;
            c.D = 32;
            c.cu_q = cu_from_lengths(lens);
            c.causal = true;
            c.wl = 9;
            c.block_q = b;
            c.block_k = idx % 2 ? b : 512 / (b / 32 + 1); // square and mixed tilings
            c.num_threads = 2;
            Problem pb(c, Storage::Packed, rng);
            Plan plan(c);
            require_plan(plan);
            check_against_oracle(plan, pb);
        }
}

TEST_CASE("SPEC 10 case 3: a row masked in every block", "[spec][case3]")
{
    // Each variant leaves some rows without any allowed key while every key block is visited by
    // other rows: O must be exactly 0, LSE -inf, dQ exactly 0, and no NaN anywhere else.
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int variant = 0; variant < 3; ++variant) {
            std::mt19937_64 rng(seed_for("case3", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 2;
            c.D = 32;
            c.Dv = backend_dim(20); // off the 8-column units where the backend allows it
            c.block_q = 16;
            c.block_k = 8;
            switch (variant) {
            case 0: // more queries than keys + causal: rows 0..19 precede every key
                c.cu_q = {0, 50};
                c.cu_k = {0, 30};
                c.causal = true;
                break;
            case 1: // window_left = -1, window_right = 2 with delta = -20: rows 0..17 empty
                c.cu_q = {0, 50};
                c.cu_k = {0, 30};
                c.wl = -1;
                c.wr = 2;
                break;
            case 2: // a sequence with 0 keys between two normal ones
                c.cu_q = {0, 40, 60, 100};
                c.cu_k = {0, 40, 40, 80};
                break;
            }
            Problem pb(c, Storage::Packed, rng);
            Plan plan(c);
            require_plan(plan);
            INFO("variant " << variant << " config: " << c.describe());
            REQUIRE(check_against_oracle(plan, pb));
            const int64_t expect = variant == 0 ? 20 * c.H : variant == 1 ? 18 * c.H : 20 * c.H;
            CHECK(count_empty_rows(pb) == expect);
        }
}

TEST_CASE("SPEC 10 case 4: the only valid logit is -1e30", "[spec][case4]")
{
    // scale = 1e30, q_i = e_0, k_j = -c_j e_0, window (0, 0): row i sees only key i, with logit
    // -c_i * 1e30. O_i must be exactly v_i and LSE_i = -c_i * 1e30; a finite mask sentinel or an
    // unguarded state gives garbage or NaN.
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int bk : {512, 64, 0}) {
            std::mt19937_64 rng(seed_for("case4a", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 2;
            c.D = 16;
            c.Dv = 8;
            c.cu_q = {0, 600, 610};
            c.wl = 0;
            c.wr = 0;
            c.scale = 1e30f;
            c.block_k = bk;
            Problem pb(c, Storage::Packed, rng);
            for (int64_t t = 0; t < c.Tq(); ++t)
                for (int h = 0; h < c.H; ++h)
                    for (int cc = 0; cc < c.D; ++cc) {
                        pb.q.set(t, h, cc, cc == 0 ? 1.0 : 0.0);
                        pb.k.set(t, h, cc, cc == 0 ? -(1.0 + (double)(t % 64) / 64.0) : 0.0);
                    }
            Plan plan(c);
            require_plan(plan);
            INFO("config: " << c.describe());
            pb.poison_forward_outputs();
            REQUIRE(run_forward(plan, pb) == RINGATTN_SUCCESS);
            int64_t bad_o = 0, bad_lse = 0;
            for (int64_t t = 0; t < c.Tq(); ++t)
                for (int h = 0; h < c.H; ++h) {
                    for (int cc = 0; cc < c.Dv; ++cc) bad_o += pb.o.bits(t, h, cc) != pb.v.bits(t, h, cc);
                    const double ref = -(1.0 + (double)(t % 64) / 64.0) * (double)1e30f;
                    const double got = pb.lse[(size_t)(h * c.Tq() + t)];
                    bad_lse += !(std::fabs(got - ref) <= 1e-6 * std::fabs(ref));
                }
            CHECK(bad_o == 0);
            CHECK(bad_lse == 0);
            // Backward: the softmax of one key is constant, so the exact dQ and dK are 0; with
            // scale 1e30 any float32 rounding of dP - D_i (~1e-7) becomes ~1e23, so only
            // finiteness is required for them, and only where the storage dtype can hold such
            // values (float16 tops out at 65504). dV_i = P_ii dO_i = dO_i.
            pb.poison_backward_outputs();
            REQUIRE(run_backward(plan, pb) == RINGATTN_SUCCESS);
            if (dt != RINGATTN_FLOAT16) {
                CHECK(!pb.dq.any_nonfinite());
                CHECK(!pb.dk.any_nonfinite());
            } else {
                CHECK(!any_nan(pb.dq)); // overflow to inf is the storage's limit; NaN is not
                CHECK(!any_nan(pb.dk));
            }
            CHECK(!pb.dv.any_nonfinite());
            const double e_dv = max_rel_err(pb.dv.to_dense(), pb.dout.to_dense());
            CHECK(e_dv <= (dt == RINGATTN_FLOAT32 ? 1e-6 : 0.0));
        }
}

TEST_CASE("SPEC 10 case 4: valid logits below -5e4", "[spec][case4]")
{
    // Logits -65536 + (small exact terms): q_0 k_0 = -65536 and the other components are
    // multiples of 1/8 in [-1, 1], so every float32 dot product and partial sum is exact and the
    // usual tolerances apply. A mask sentinel of -1e4 / -5e4 / dtype-min would outweigh them.
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int variant = 0; variant < 2; ++variant) {
            std::mt19937_64 rng(seed_for("case4b", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 2;
            c.Hkv = 1;
            c.D = 32;
            c.Dv = 16;
            c.cu_q = {0, 200, 290};
            c.scale = 1.0f;
            c.causal = true;
            c.wl = variant ? 20 : -1;
            c.block_q = 32;
            c.block_k = 64;
            Problem pb(c, Storage::Packed, rng);
            // float16 cannot store 65536: use 2 * -32768 there.
            const double q0 = dt == RINGATTN_FLOAT16 ? 2.0 : 1.0, k0 = -65536.0 / q0;
            std::uniform_int_distribution<int> eighth(-8, 8);
            for (int64_t t = 0; t < c.Tq(); ++t) {
                for (int h = 0; h < c.H; ++h)
                    for (int cc = 0; cc < c.D; ++cc) pb.q.set(t, h, cc, cc == 0 ? q0 : eighth(rng) / 8.0);
                for (int cc = 0; cc < c.D; ++cc) pb.k.set(t, 0, cc, cc == 0 ? k0 : eighth(rng) / 8.0);
            }
            Plan plan(c);
            require_plan(plan);
            // |LSE| ~ 6.5e4 has a float32 ulp of 2^-7: P = exp(s - LSE) from the stored LSE would
            // be off by up to 0.4%; the backward recomputes such rows' max and sum (SPEC 9), so
            // the gradients are checked against the exact reference, at the plain limits (the
            // logits are exact: S = 65536 would scale the limits by 4096).
            CheckOptions exact;
            exact.exact_logits = true;
            REQUIRE(check_against_oracle(plan, pb, exact));
            bool below = true;
            for (int64_t i = 0; i < c.H * c.Tq(); ++i) below = below && pb.lse[(size_t)i] < -5e4f;
            CHECK(below);
        }
}

TEST_CASE("SPEC 10 case 7: scratch left poisoned by earlier calls changes nothing", "[spec][case7]")
{
    for (ringattn_dtype_t dt : all_dtypes) {
        std::mt19937_64 rng(seed_for("case7", (uint64_t)dt));
        // 1. A large plan runs on all-NaN inputs (its workspace fills with NaN), then is
        //    destroyed; its memory goes back to the allocator.
        {
            AttnConfig big;
            big.dtype = dt;
            big.H = 4;
            big.D = 128;
            big.Dv = 128;
            big.cu_q = {0, 300, 700};
            big.block_q = 256;
            big.block_k = 512;
            big.num_threads = 2;
            Problem pb(big, Storage::Packed, rng);
            Plan plan(big);
            require_plan(plan);
            run_on_nan_inputs(plan, pb);
        }
        // 2. A smaller plan on clean data matches the oracle; 3. the same plan runs on NaN inputs
        //    (poisoning its own workspace), then again on the clean inputs: bitwise the first
        //    clean result.
        AttnConfig c;
        c.dtype = dt;
        c.H = 4;
        c.Hkv = 2;
        c.D = 64;
        c.Dv = 40;
        c.cu_q = {0, 77, 200};
        c.causal = true;
        c.wl = 33;
        c.block_q = 64;
        c.block_k = 32;
        c.num_threads = 2;
        INFO("dtype " << dtype_name(dt));
        check_poisoned_scratch_changes_nothing(c, rng);
    }
}

TEST_CASE("SPEC 10 case 11: the backward of rows whose every logit is about -1e30", "[spec][case11]")
{
    // A key bias of -1e30 on every key: each logit -1e30 + z rounds to -1e30 in float32 and in
    // float64 alike, so every row's softmax is exactly uniform over its keys and the float32
    // LSE, -1e30, has lost log(l). P = exp(s - LSE) from it would be 1 for every key: gradients
    // l times too large (2x for two keys). The backward recomputes such rows' max and sum
    // (SPEC 9); the plain limits apply (the logits are exact).
    CheckOptions exact;
    exact.exact_logits = true;
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes) {
        std::mt19937_64 rng(seed_for("case11", (uint64_t)idx++));
        AttnConfig c; // causal, T = 100, a bias head per kv head, tiles smaller than the sequence
        c.dtype = dt;
        c.H = 2;
        c.Hkv = 1;
        c.D = 16;
        c.cu_q = {0, 100};
        c.causal = true;
        c.block_q = 16;
        c.block_k = 24;
        c.key_bias_heads = 1;
        c.bias.assign(100, -1e30);
        Problem pb(c, Storage::Packed, rng);
        Plan plan(c);
        require_plan(plan);
        INFO("causal, T = 100, " << dtype_name(dt));
        CHECK(check_against_oracle(plan, pb, exact));
    }
    // Two keys both at -1e30 (H = 1, D = 4, no mask): the 2x case, dBias included.
    std::mt19937_64 rng(seed_for("case11", 99));
    AttnConfig c;
    c.H = 1;
    c.D = 4;
    c.cu_q = {0, 2};
    c.key_bias_heads = 1;
    c.bias = {-1e30, -1e30};
    Problem pb(c, Storage::Packed, rng);
    Plan plan(c);
    require_plan(plan);
    INFO("two keys");
    CHECK(check_against_oracle(plan, pb, exact));
}

TEST_CASE("SPEC 10 case 12 with softcap 5: q and k of 1.5e19 at the default scale",
          "[spec][case12]")
{
    // issue 28, finding 9: softcap * tanh(q . k scale / softcap) with the scale alone before the
    // product, partial sums of 7 terms of 5.6e37 overflow (cases.hpp); with 1/softcap folded
    // into it they stay below 8e37
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16}) {
        std::mt19937_64 rng(seed_for("case12 softcap", (uint64_t)dt));
        AttnConfig c;
        c.dtype = dt, c.H = 2, c.Hkv = 1, c.D = 16;
        c.cu_q = {0, 37, 100};
        c.causal = true;
        c.softcap = 5.0f; // scale 1/sqrt(16)
        c.block_q = 16, c.block_k = 24;
        Problem pb(c, Storage::Packed, rng);
        set_softcap_overflow_qk(pb, 1.5e19, rng);
        Plan plan(c);
        require_plan(plan);
        INFO(dtype_name(dt));
        CHECK(check_against_oracle(plan, pb));
    }
}

TEST_CASE("SPEC 10 case 12: q and k of 1.5e19 with scale 0.01", "[spec][case12]")
{
    // D = 16 entries of +-1.5e19: q . k reaches 16 * 2.25e38 = 3.6e39, beyond float32, while
    // the scaled logit, at most 3.6e37, is finite: the scale must go first (SPEC 9). Every key
    // has the same signs, so a row's logits are equal in exact arithmetic and its LSE (up to
    // ~3.6e37) is lossy: the backward recomputes the row's max and sum. Variant 0 is the case as
    // SPEC 10 gives it, judged with S-scaled limits (float32 rounding of sums of 2.25e36 terms
    // moves a logit by ~1e30); variant 1 takes entries of +-2^63 and scale 2^-7, where the
    // unscaled sum overflows alike (16 * 2^126) but every product and partial sum of the scaled
    // one is exact, so the plain limits apply. float16 cannot store such values.
    for (int variant = 0; variant < 2; ++variant)
        for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16}) {
            std::mt19937_64 rng(seed_for("case12", (uint64_t)(2 * dt + variant)));
            const double x = variant ? std::ldexp(1.0, 63) : 1.5e19;
            AttnConfig c;
            c.dtype = dt;
            c.H = 2;
            c.Hkv = 1;
            c.D = 16;
            c.cu_q = {0, 37, 100};
            c.causal = true;
            c.scale = variant ? 0.0078125f : 0.01f;
            c.block_q = 16;
            c.block_k = 24;
            Problem pb(c, Storage::Packed, rng);
            set_equal_logit_qk(pb, x, rng);
            Plan plan(c);
            require_plan(plan);
            INFO(dtype_name(dt) << ", variant " << variant);
            CheckOptions opt;
            opt.exact_logits = variant == 1;
            CHECK(check_against_oracle(plan, pb, opt));
            double largest = 0; // the logits do reach the range where the sum would overflow
            for (float l : pb.lse)
                if (std::isfinite(l)) largest = std::max(largest, std::fabs((double)l));
            CHECK(largest > 1e36);
        }
}
