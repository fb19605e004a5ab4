// Dynamic mask attention (SPEC 6): a per-key float32 bias [H_b, T_k] added to the logits (not
// scaled) and an optional top-k selection per query row over its whole sequence. Forward (O,
// LSE) and backward (dQ, dK, dV, dBias) of the public API against the float64 oracle under
// SPEC 9's tolerances, outputs poisoned with NaN before every call (support/shim.cpp); rows
// with no allowed key and keys no row keeps. SPEC 10 case 10 is in test_dynamic_spec.cpp,
// finite differences and the oracle's selection in test_dynamic_fd.cpp.
#include "unit/dynamic_common.hpp"

using namespace dyntest;


// ------------------------------------------------------------------------------------------
// 1. Random cases against the float64 oracle.

TEST_CASE("dynamic mask: random shapes, masks, bias heads and keep_k, float32", "[dynamic][fwd][bwd]")
{
    for (int it = 0; it < 60; ++it) {
        std::mt19937_64 rng(seed_for("dyn-random-f32", (uint64_t)it));
        const AttnConfig c = random_dyn_config(rng, RINGATTN_FLOAT32, 90, it);
        CaseOpts o;
        o.st = random_storage(rng, c);
        o.sigma_qk = c.softcap > 0 ? 2.5 : 1.0;
        o.sigma_bias = pick(rng, {1, 1, 3});
        o.quantize = rng() % 3 == 0;
        run_case(c, rng, o);
    }
}

TEST_CASE("dynamic mask: random shapes, float16 and bfloat16", "[dynamic][fwd][bwd][half]")
{
    for (int it = 0; it < 40; ++it) {
        std::mt19937_64 rng(seed_for("dyn-random-half", (uint64_t)it));
        const AttnConfig c = random_dyn_config(rng, it % 2 ? RINGATTN_BFLOAT16 : RINGATTN_FLOAT16, 80, it);
        CaseOpts o;
        o.st = random_storage(rng, c);
        o.sigma_qk = c.softcap > 0 ? 2.5 : 1.0;
        o.quantize = it % 4 == 1;
        run_case(c, rng, o);
    }
}

TEST_CASE("dynamic mask: every H_b, GQA ratio, keep_k and mask", "[dynamic][fwd][bwd]")
{
    // H_kv = 2 and G = 1, 2, 4: H_b = 1, H_kv and H are three different mappings whenever G > 1.
    // Tiles of 1, 7 and 24 keys over a 70-key sequence: at least 3 KV blocks, and the bias must
    // be applied in every one of them.
    int idx = 0;
    for (int G : {1, 2, 4})
        for (int hb = 0; hb < 3; ++hb)
            for (int kc = 0; kc < 5; ++kc)
                for (MaskKind m : all_masks) {
                    std::mt19937_64 rng(seed_for("dyn-grid", (uint64_t)idx));
                    AttnConfig c;
                    c.Hkv = 2;
                    c.H = 2 * G;
                    c.D = 16;
                    c.Dv = 12;
                    c.cu_q = cu_from_lengths({70, 0, 1, 45});
                    set_mask(c, m, rng);
                    c.key_bias_heads = bias_heads(c, hb);
                    c.keep_k = kc == 3 ? 12 : keep_choice(c, kc, rng);
                    const int blocks[][2] = {{7, 24}, {24, 7}, {16, 1}, {1, 7}, {0, 24}};
                    c.block_q = blocks[idx % 5][0];
                    c.block_k = blocks[idx % 5][1];
                    c.num_threads = 1 + idx % 2;
                    CaseOpts o;
                    o.quantize = (idx + idx / 4) % 3 == 2; // every keep_k, mask and H_b
                    run_case(c, rng, o);
                    ++idx;
                }
}

TEST_CASE("dynamic mask: every dtype with every mask, softcap and ALiBi on and off", "[dynamic][fwd][bwd][half]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (MaskKind m : all_masks)
            for (int opt = 0; opt < 2; ++opt) {
                std::mt19937_64 rng(seed_for("dyn-dtype-mask", (uint64_t)idx));
                AttnConfig c;
                c.dtype = dt;
                c.H = 4;
                c.Hkv = 2;
                c.D = 32;
                c.Dv = 24;
                c.cu_q = cu_from_lengths({1 + (int)(rng() % 90), 0, 1, 60 + (int)(rng() % 100)});
                c.cu_k = cu_from_lengths({c.cu_q[1] + 17, 4, 1, c.cu_q[4] - c.cu_q[3]});
                set_mask(c, m, rng);
                if (opt) {
                    c.softcap = 5.0f;
                    c.alibi = alibi_slopes(c.H);
                }
                c.block_q = 32;
                c.block_k = 16;
                c.key_bias_heads = bias_heads(c, idx % 3);
                c.keep_k = keep_choice(c, idx % 5, rng);
                CaseOpts o;
                o.sigma_qk = opt ? 3.0 : 1.0;
                run_case(c, rng, o);
                ++idx;
            }
}

TEST_CASE("dynamic mask: tile sizes 1, 7 and 64 with at least 3 KV blocks", "[dynamic][fwd][bwd][blocks]")
{
    int idx = 0;
    for (int bq : {1, 7, 64})
        for (int bk : {1, 7, 64}) {
            if (bq == 1 && bk == 1) continue;
            std::mt19937_64 rng(seed_for("dyn-blocks", (uint64_t)idx));
            AttnConfig c;
            c.H = 2;
            c.Hkv = 1;
            c.D = 16;
            c.Dv = 8;
            c.cu_q = cu_from_lengths({200 + (int)(rng() % 60), 1, (int)(rng() % 70)});
            set_mask(c, all_masks[idx % 4], rng);
            c.block_q = bq;
            c.block_k = bk;
            c.key_bias_heads = idx % 2 ? 2 : 1;
            c.keep_k = keep_choice(c, idx % 5, rng);
            run_case(c, rng);
            ++idx;
        }
}

TEST_CASE("dynamic mask: dBias not requested, strides, threads and repeatability", "[dynamic][fwd][bwd]")
{
    for (int it = 0; it < 8; ++it) {
        std::mt19937_64 rng(seed_for("dyn-misc", (uint64_t)it));
        AttnConfig c = random_dyn_config(rng, all_dtypes[it % 3], 80, it);
        c.num_threads = 2;
        CaseOpts o;
        o.st = (Storage)(it % 3 + 1); // PackedZero, Padded, Interleaved
        if (o.st == Storage::Interleaved && !c.cu_k.empty()) o.st = Storage::Padded;
        o.want_dbias = it % 2 == 0; // dbias = NULL: dQ, dK, dV still right
        o.determinism = true;
        run_case(c, rng, o);
    }
}

TEST_CASE("dynamic mask: the thread count changes no bit, dBias included", "[dynamic][fwd][bwd][determinism]")
{
    for (int it = 0; it < 6; ++it) {
        std::mt19937_64 rng(seed_for("dyn-thread-bits", (uint64_t)it));
        AttnConfig c = random_dyn_config(rng, all_dtypes[it % 3], 120, it);
        check_thread_counts_change_nothing(c, rng, {2, 3});
    }
}

TEST_CASE("dynamic mask: top-k under sliding windows with heavy ties, long sequences", "[dynamic][fwd][bwd]")
{
    // Each row's valid set slides along the sequence, and the biases take 3 or 4 distinct values:
    // the keep_k-th largest is nearly always a tie, decided by position, and changes from row
    // to row. Lengths beyond the default tile; one variant with more keys than queries.
    struct W {
        bool causal;
        int wl, wr;
    };
    const W windows[] = {{true, 100, -1}, {false, 50, 20}, {false, -1, 10}, {false, -1, -1}};
    int idx = 0;
    for (const W &w : windows)
        for (int keep : {1, 2, 17, 64, 150}) {
            std::mt19937_64 rng(seed_for("dyn-ties-long", (uint64_t)idx));
            AttnConfig c;
            c.H = 2;
            c.Hkv = 1;
            c.D = 16;
            c.Dv = 8;
            c.cu_q = cu_from_lengths({500, 37});
            if (idx % 5 == 4) c.cu_k = cu_from_lengths({530, 90});
            c.causal = w.causal;
            c.wl = w.wl;
            c.wr = w.wr;
            c.block_q = idx % 2 ? 0 : 32;
            c.block_k = idx % 2 ? 0 : 7;
            c.num_threads = 2;
            c.key_bias_heads = idx % 2 ? 2 : 1;
            c.keep_k = keep;
            Problem pb(c, Storage::Packed, rng);
            const int levels = 3 + idx % 2;
            std::vector<double> b = pb.cfg.bias;
            for (double &x : b) x = (double)(rng() % (uint64_t)levels) - 1.0;
            pb.set_bias(b);
            Plan plan(c);
            require_plan(plan);
            INFO("config: " << c.describe());
            check_against_oracle(plan, pb);
            ++idx;
        }
}
// ------------------------------------------------------------------------------------------
// 4. Rows with no allowed key, keys no row sees, very negative biases.

TEST_CASE("dynamic mask: rows with no allowed key and keys no query keeps", "[dynamic][mask]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int variant = 0; variant < 4; ++variant) {
            std::mt19937_64 rng(seed_for("dyn-empty-rows", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 4;
            c.Hkv = 2;
            c.D = 32;
            c.Dv = 16;
            c.cu_q = cu_from_lengths({60, 40, 25, 0});
            c.cu_k = cu_from_lengths({30, 0, 25, 6}); // seq 3: 6 keys, no query
            c.block_q = 8;
            c.block_k = 8;
            set_empty_rows_mask(c, variant);
            c.key_bias_heads = bias_heads(c, idx % 3);
            c.keep_k = pick(rng, {0, 1, 3, 1000});
            Problem pb(c, Storage::Padded, rng);
            Plan plan(c);
            require_plan(plan);
            INFO("variant " << variant << " config: " << c.describe());
            // O = 0 and LSE = -inf exactly on empty rows, dQ = 0 there, no NaN, and dBias exactly
            // 0 for keys no query keeps (check_against_oracle).
            REQUIRE(check_against_oracle(plan, pb));
            CHECK(count_empty_rows(pb) > 0);
            bool zero = true;
            for (int64_t j = c.Tk() - 6; j < c.Tk(); ++j) {
                for (int h = 0; h < c.hkv(); ++h) {
                    for (int cc = 0; cc < c.D; ++cc) zero = zero && pb.dk.get(j, h, cc) == 0.0;
                    for (int cc = 0; cc < c.Dv; ++cc) zero = zero && pb.dv.get(j, h, cc) == 0.0;
                }
                for (int hb = 0; hb < c.key_bias_heads; ++hb)
                    zero = zero && pb.dbias_buf[(size_t)(hb * c.Tk() + j)] == 0.0f;
            }
            CHECK(zero);
        }
}

TEST_CASE("dynamic mask: empty batches with a bias", "[dynamic][mask]")
{
    int idx = 0;
    for (auto &cu : empty_batches)
        for (int keep : {0, 2}) {
            std::mt19937_64 rng(seed_for("dyn-empty", (uint64_t)idx++));
            AttnConfig c;
            c.H = 2;
            c.D = 8;
            c.cu_q = cu[0];
            c.cu_k = cu[1];
            c.causal = idx % 2;
            c.key_bias_heads = 2;
            c.keep_k = keep;
            Problem pb(c, Storage::Packed, rng);
            Plan plan(c);
            require_plan(plan);
            INFO("config: " << c.describe());
            REQUIRE(check_against_oracle(plan, pb));
            bool zero = true;
            for (size_t i = 0; i < pb.bias_elems(); ++i) zero = zero && pb.dbias_buf[i] == 0.0f;
            CHECK(zero);
        }
}

TEST_CASE("dynamic mask: very negative biases (-1e30) are valid logits", "[dynamic][mask][case4]")
{
    // Bias -1e30 on every even key. Causal row 0 has only key 0: its logit is -1e30 + z = -1e30,
    // so O = v_0 exactly and LSE = -1e30 (finite); every other row sees an odd key, and the
    // even keys get P = 0 (or are not selected with top-k).
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int keep : {0, 1, 3}) {
            std::mt19937_64 rng(seed_for("dyn-neg-bias", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 2;
            c.Hkv = 1;
            c.D = 16;
            c.Dv = 8;
            c.cu_q = {0, 70};
            c.causal = true;
            c.wl = idx % 2 ? 1 : -1;
            c.block_q = 16;
            c.block_k = 7;
            c.key_bias_heads = 1;
            c.keep_k = keep;
            Problem pb(c, Storage::Packed, rng);
            std::vector<double> b = pb.cfg.bias;
            for (size_t j = 0; j < b.size(); j += 2) b[j] = -1e30;
            pb.set_bias(b);
            Plan plan(c);
            require_plan(plan);
            INFO("config: " << c.describe());
            // The plain limits (SPEC 9's S <= 16): -1e30 + z is -1e30 in float32 and float64
            // alike, so those logits are exact, and S = 1e30 would make the limits vacuous.
            CheckOptions exact;
            exact.exact_logits = true;
            REQUIRE(check_against_oracle(plan, pb, exact));
            int64_t bad_o = 0;
            for (int h = 0; h < c.H; ++h) {
                for (int cc = 0; cc < c.Dv; ++cc) bad_o += pb.o.bits(0, h, cc) != pb.v.bits(0, 0, cc);
                CHECK(lse_at(pb, h, 0) == (float)-1e30);
            }
            CHECK(bad_o == 0);
            // The other rows' LSE against the plain float32 limit (SPEC 9's per-row norm, as
            // check_against_oracle measures it, but without its scaling by the -1e30 logits).
            const FwdResult ref = oracle_forward(pb.cfg, pb.q.to_dense(), pb.k.to_dense(), pb.v.to_dense());
            double worst = 0;
            for (int h = 0; h < c.H; ++h)
                for (int64_t t = 1; t < c.Tq(); ++t) {
                    const double r = ref.lse[(size_t)(h * c.Tq() + t)];
                    worst = std::max(worst, std::fabs(lse_at(pb, h, t) - r) / std::max(1.0, std::fabs(r)));
                }
            CHECK(worst <= 1e-5); // same stored inputs on both sides: float32 LSE rounding only
        }
}

TEST_CASE("dynamic mask: -inf biases are keys no row uses; a row left with only those is empty", "[dynamic][mask]")
{
    // -inf on every third key of each sequence, from its third: a sequence's first key and any
    // two neighbouring keys hold a finite one, so every row keeps a usable key (windows of at
    // least 2 keys) and the oracle applies as is.
    int idx = 0;
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16})
        for (int keep : {0, 1, 3, 20}) {
            std::mt19937_64 rng(seed_for("dyn-ninf-bias", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 4;
            c.Hkv = 2;
            c.D = 16;
            c.cu_q = {0, 90, 170};
            c.causal = true;
            c.wl = pick(rng, {-1, 1, 6});
            c.block_q = 16;
            c.block_k = 8;
            c.key_bias_heads = pick(rng, {1, 2, 4});
            c.keep_k = keep;
            Problem pb(c, Storage::Packed, rng);
            std::vector<double> b = pb.cfg.bias;
            for (int hb = 0; hb < c.key_bias_heads; ++hb)
                for (size_t sq = 0; sq + 1 < c.cu_q.size(); ++sq)
                    for (int t = c.cu_q[sq] + 2; t < c.cu_q[sq + 1]; t += 3) b[(size_t)(hb * c.Tk() + t)] = NINF;
            pb.set_bias(b);
            Plan plan(c);
            require_plan(plan);
            INFO("config: " << c.describe());
            CHECK(check_against_oracle(plan, pb));
        }
    // Each row sees only its own key (window 0); even keys have bias -inf, so even rows have no
    // usable key: O = 0, LSE = -inf, dQ = 0, and the even keys get dK = dV = dBias = 0.
    for (int keep : {0, 1}) {
        std::mt19937_64 rng(seed_for("dyn-ninf-rows", (uint64_t)keep));
        AttnConfig c;
        c.H = 2;
        c.Hkv = 1;
        c.D = 8;
        c.cu_q = {0, 40};
        c.causal = true;
        c.wl = 0;
        c.block_q = 16;
        c.block_k = 8;
        c.key_bias_heads = 1;
        c.keep_k = keep;
        Problem pb(c, Storage::Packed, rng);
        std::vector<double> b = pb.cfg.bias;
        for (size_t j = 0; j < b.size(); j += 2) b[j] = NINF;
        pb.set_bias(b);
        Plan plan(c);
        require_plan(plan);
        run_both(plan, pb);
        int64_t wrong = 0;
        for (int64_t t = 0; t < c.Tq(); ++t) {
            const bool empty = t % 2 == 0;
            for (int h = 0; h < c.H; ++h) {
                wrong += empty ? lse_at(pb, h, t) != NINF : !std::isfinite(lse_at(pb, h, t));
                for (int cc = 0; cc < c.D; ++cc) {
                    wrong += empty && (pb.o.get(t, h, cc) != 0 || pb.dq.get(t, h, cc) != 0);
                    wrong += !std::isfinite(pb.o.get(t, h, cc)) || !std::isfinite(pb.dq.get(t, h, cc));
                }
            }
            for (int cc = 0; cc < c.D; ++cc) {
                wrong += empty && (pb.dk.get(t, 0, cc) != 0 || pb.dv.get(t, 0, cc) != 0);
                wrong += !std::isfinite(pb.dk.get(t, 0, cc)) || !std::isfinite(pb.dv.get(t, 0, cc));
            }
            wrong += empty ? pb.dbias_buf[(size_t)t] != 0 : !std::isfinite(pb.dbias_buf[(size_t)t]);
        }
        CHECK(wrong == 0);
    }
}

TEST_CASE("dynamic mask: scratch poisoned by NaN inputs changes nothing", "[dynamic][case7]")
{
    for (ringattn_dtype_t dt : all_dtypes) {
        std::mt19937_64 rng(seed_for("dyn-case7", (uint64_t)dt));
        AttnConfig c;
        c.dtype = dt;
        c.H = 4;
        c.Hkv = 2;
        c.D = 32;
        c.Dv = 24;
        c.cu_q = {0, 77, 200};
        c.causal = true;
        c.wl = 50;
        c.block_q = 32;
        c.block_k = 16;
        c.num_threads = 2;
        c.key_bias_heads = 2;
        c.keep_k = 9;
        INFO("dtype " << dtype_name(dt));
        check_poisoned_scratch_changes_nothing(c, rng);
    }
}

TEST_CASE("dynamic mask: a plan is reusable, backward selects from the bias it is given", "[dynamic][bwd]")
{
    // Problems A and B share a plan and differ in their bias (so in their selections). Forward A,
    // forward B, backward A must equal forward A, backward A bitwise; and a fresh plan's first call
    // being a backward (O and LSE from elsewhere) must give the same, bitwise: no selection state
    // carried over from an earlier call.
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16})
        for (int ring_like = 0; ring_like < 2; ++ring_like) {
            std::mt19937_64 rng(seed_for("dyn-reuse", (uint64_t)(dt * 2 + ring_like)));
            AttnConfig c;
            c.dtype = dt;
            c.H = 4;
            c.Hkv = 2;
            c.D = 32;
            c.Dv = 16;
            c.cu_q = {0, 120, 181};
            c.causal = ring_like != 0;
            c.block_q = 16;
            c.block_k = 16;
            c.key_bias_heads = 2;
            c.keep_k = 6;
            Problem a(c, Storage::Packed, rng), b(c, Storage::Packed, rng);
            Plan plan(c);
            require_plan(plan);
            REQUIRE(check_against_oracle(plan, a));
            const Outputs ref(a);
            // forward B in between
            b.poison_forward_outputs();
            REQUIRE(run_forward(plan, b) == RINGATTN_SUCCESS);
            a.poison_backward_outputs();
            REQUIRE(run_backward(plan, a) == RINGATTN_SUCCESS);
            check_same_backward(Outputs(a), ref);
            // a fresh plan whose first call is this backward
            Plan fresh(c);
            require_plan(fresh);
            a.poison_backward_outputs();
            REQUIRE(run_backward(fresh, a) == RINGATTN_SUCCESS);
            check_same_backward(Outputs(a), ref);
            // and B's forward was B's own
            REQUIRE(check_against_oracle(plan, b));
        }
}

// ------------------------------------------------------------------------------------------
// The oracle's selection against a brute-force rank count, and its forward against it.
