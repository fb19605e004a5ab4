// The single-rank catalogue on the CUDA backend, forward and backward, through the public API: RATEST_BACKEND=
// cuda against the emulated library in CI (the real kernel and backend code over the SIMT
// emulation), and against the nvcc-built library on a GPU. Every case: fresh random inputs,
// outputs poisoned, the float64 oracle with SPEC 9's rule for O, LSE, dQ, dK, dV and dBias
// (check_against_oracle: also padding and inputs untouched, empty rows exact), then the same
// calls under a second schedule (threads and streams in another order; on a GPU simply again)
// with bitwise equal outputs. Sizes are a few tiles per dimension: every path of the kernels,
// in seconds on the emulation.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "support/cases.hpp"
#include "support/finite_diff.hpp"

using namespace ratest;

namespace {

// c under storage st against the oracle (schedule 0), then again under schedule 1: the same bits.
bool check_case(const AttnConfig &c, Storage st, uint64_t seed, double sigma_qk = 1.0,
                Problem *given = nullptr, const CheckOptions &opt = CheckOptions())
{
    std::mt19937_64 rng(seed);
    Problem own(c, st, rng, sigma_qk);
    Problem &pb = given ? *given : own;
    Plan plan(c);
    INFO("config: " << c.describe() << " storage " << (int)st);
    require_plan(plan);
    set_schedule(0);
    const bool ok = check_against_oracle(plan, pb, opt);
    const std::vector<unsigned char> o = pb.o.buf->bytes, dq = pb.dq.buf->bytes,
                                     dk = pb.dk.buf->bytes, dv = pb.dv.buf->bytes;
    const std::vector<float> lse = pb.lse, dbias = pb.dbias_buf;
    set_schedule(1, seed);
    pb.poison_forward_outputs();
    const ringattn_status_t st2 = run_forward(plan, pb);
    INFO("second schedule: " << ringattn_last_error());
    REQUIRE(st2 == RINGATTN_SUCCESS);
    pb.poison_backward_outputs();
    const ringattn_status_t st3 = run_backward(plan, pb);
    set_schedule(0);
    REQUIRE(st3 == RINGATTN_SUCCESS);
    CHECK(std::memcmp(o.data(), pb.o.buf->bytes.data(), o.size()) == 0);
    CHECK(std::memcmp(lse.data(), pb.lse.data(), lse.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(dq.data(), pb.dq.buf->bytes.data(), dq.size()) == 0);
    CHECK(std::memcmp(dk.data(), pb.dk.buf->bytes.data(), dk.size()) == 0);
    CHECK(std::memcmp(dv.data(), pb.dv.buf->bytes.data(), dv.size()) == 0);
    CHECK(std::memcmp(dbias.data(), pb.dbias_buf.data(), dbias.size() * sizeof(float)) == 0);
    return ok;
}

AttnConfig base(ringattn_dtype_t dt, std::vector<int32_t> cu, int H = 2, int Hkv = 1, int D = 64,
                int Dv = 0)
{
    AttnConfig c;
    c.dtype = dt, c.cu_q = cu, c.H = H, c.Hkv = Hkv, c.D = D, c.Dv = Dv;
    return c;
}

const Mask masks[] = {{"none", 0, -1, -1},       {"causal", 1, -1, -1}, {"window", 0, 17, 9},
                      {"causal window", 1, 40, -1}, {"narrow", 0, 0, 0}};

} // namespace

TEST_CASE("CUDA: every dtype with every mask on ragged batches with empty sequences", "[cuda]")
{
    uint64_t seed = seed_for("cuda masks", 0);
    for (ringattn_dtype_t dt : all_dtypes)
        for (const Mask &m : masks) {
            std::mt19937_64 rng(++seed);
            AttnConfig c = base(dt, cu_from_lengths({70, 0, 1, 130}), 4, 2);
            apply(c, m);
            set_random_keys(c, {70, 0, 1, 130}, rng);
            CHECK(check_case(c, Storage::Packed, seed));
        }
}

TEST_CASE("CUDA: random shapes, GQA ratios, logit options and storage", "[cuda]")
{
    std::mt19937_64 rng(seed_for("cuda random", 0));
    const Storage storages[] = {Storage::Packed, Storage::PackedZero, Storage::PaddedAligned,
                                Storage::InterleavedAligned};
    for (int i = 0; i < 12; ++i) {
        AttnConfig c;
        c.dtype = all_dtypes[i % 3];
        const int hkv = pick(rng, {1, 2}), ratio = pick(rng, {1, 2, 3});
        c.Hkv = hkv, c.H = hkv * ratio;
        c.D = pick(rng, {32, 64});
        c.Dv = rng() % 3 == 0 ? pick(rng, {32, 64}) : 0;
        const std::vector<int> lens = ragged(rng, 1 + (int)(rng() % 3), 150);
        c.cu_q = cu_from_lengths(lens);
        set_random_keys(c, lens, rng);
        set_mask(c, (MaskKind)(rng() % 6), rng);
        set_random_logit_options(c, rng);
        Storage st = storages[rng() % 4];
        if (st == Storage::InterleavedAligned && !c.cu_k.empty()) st = Storage::PaddedAligned;
        CHECK(check_case(c, st, rng(), c.softcap > 0 ? 2.5 : 1.0));
    }
}

TEST_CASE("CUDA: head dims 16 to 256 with D_v != D, D_v up to 256", "[cuda][dims]")
{
    struct Dims {
        int d, dv;
    };
    // D_v above 128 runs as two blocks of columns per tile: 256 and 136 (the second 8 wide)
    const Dims dims[] = {{32, 64},  {64, 32},   {80, 80},   {80, 48}, {128, 96},
                         {256, 128}, {256, 256}, {64, 136}, {16, 8}};
    uint64_t seed = seed_for("cuda dims", 0);
    for (ringattn_dtype_t dt : all_dtypes)
        for (const Dims &d : dims) {
            AttnConfig c = base(dt, {0, 75, 140}, 2, 1, d.d, d.dv);
            c.causal = true;
            CHECK(check_case(c, Storage::Packed, ++seed));
        }
}

TEST_CASE("CUDA: FULL tiles without a per-element mask, next to partial ones", "[cuda][mask]")
{
    // Sequences of 192 = 3 tiles: no mask (every tile FULL), causal (diagonal tiles partial),
    // a window of 64 either side (FULL, partial and EMPTY tiles in one row of tiles), and keys
    // past the last full tile (a partial key tile at the end).
    uint64_t seed = seed_for("cuda full", 0);
    for (ringattn_dtype_t dt : all_dtypes)
        for (const Mask &m : {Mask{"none", 0, -1, -1}, Mask{"causal", 1, -1, -1},
                              Mask{"band", 0, 64, 64}, Mask{"band wide", 0, 130, 0}}) {
            AttnConfig c = base(dt, {0, 192, 192 + 150}, 2, 2, 32);
            apply(c, m);
            CHECK(check_case(c, Storage::Packed, ++seed));
        }
}

TEST_CASE("CUDA: SPEC 10 case 1, decode against a poisoned 700-slot KV cache", "[cuda][spec]")
{
    uint64_t seed = seed_for("cuda case1", 0);
    for (ringattn_dtype_t dt : all_dtypes)
        for (int Hkv : {1, 2}) {
            std::mt19937_64 rng(++seed);
            AttnConfig c = base(dt, {0, 1}, 4, Hkv, 64, 32);
            c.cu_k = {0, 576};
            c.causal = true;
            c.wl = 59;
            Problem pb(c, Storage::Packed, rng);
            // slots 576..699 stay NaN: a read of one poisons the result
            pb.k = make_packed(dt, 700, Hkv, c.D);
            pb.v = make_packed(dt, 700, Hkv, c.Dv);
            pb.k.T = pb.v.T = 576;
            fill_normal(pb.k, rng);
            fill_normal(pb.v, rng);
            CHECK(check_case(c, Storage::Packed, seed, 1.0, &pb));
        }
}

TEST_CASE("CUDA: SPEC 10 cases 2, 3, 5: band masks, masked rows, lengths off the tiles", "[cuda][spec]")
{
    uint64_t seed = seed_for("cuda case2", 0);
    for (ringattn_dtype_t dt : all_dtypes) {
        AttnConfig band = base(dt, {0, 200, 264}, 2, 1, 32); // case 2 at lengths 200 and 64
        band.causal = true, band.wl = 9;
        CHECK(check_case(band, Storage::Packed, ++seed));
        // case 3: fewer keys than queries (delta < 0): causal rows 0..29 have no key at all
        AttnConfig rows = base(dt, {0, 60, 97}, 2, 2, 32);
        rows.cu_k = {0, 30, 101};
        for (int variant = 0; variant < 4; ++variant) {
            AttnConfig v = rows;
            set_empty_rows_mask(v, variant);
            CHECK(check_case(v, Storage::Packed, ++seed));
        }
        // case 5: lengths 1, 7, 63, 65, 129 (not multiples of the 64 or 32 tiles)
        CHECK(check_case(base(dt, cu_from_lengths({1, 7, 63, 65, 129}), 2, 1, 32),
                         Storage::Packed, ++seed));
    }
}

TEST_CASE("CUDA: SPEC 10 case 4 and 11, rows whose valid logits are about -1e30", "[cuda][spec]")
{
    uint64_t seed = seed_for("cuda case4", 0);
    for (ringattn_dtype_t dt : all_dtypes) {
        // a key bias of -1e30 on every key but the ones of a second head (SPEC 10 case 11's
        // forward), and on one of two keys (the other valid logit is -1e30 too)
        AttnConfig c = base(dt, {0, 100, 102}, 2, 1, 32);
        c.causal = true;
        c.key_bias_heads = 2;
        c.bias.assign((size_t)(2 * 102), 0.0);
        for (int j = 0; j < 102; ++j) c.bias[(size_t)j] = -1e30;
        c.bias[(size_t)(102 + 100)] = -1e30;
        c.bias[(size_t)(102 + 101)] = -1e30;
        CHECK(check_case(c, Storage::Packed, ++seed));
    }
}

TEST_CASE("CUDA: SPEC 10 case 11, the backward of rows whose every logit is -1e30", "[cuda][spec]")
{
    // Every logit -1e30 + z rounds to -1e30: each row's softmax is uniform and the float32 LSE,
    // -1e30, has lost log(l), so P = exp(s - LSE) would be 1 for every key (gradients l times
    // too large). The stats pass recomputes those rows' max and sum (SPEC 9); the logits are
    // exact, so the plain limits apply. T = 100: two query tiles of the passes, several key tiles.
    CheckOptions exact;
    exact.exact_logits = true;
    uint64_t seed = seed_for("cuda case11", 0);
    for (ringattn_dtype_t dt : all_dtypes) {
        AttnConfig c = base(dt, {0, 100}, 2, 1, 16);
        c.causal = true;
        c.key_bias_heads = 1;
        c.bias.assign(100, -1e30);
        CHECK(check_case(c, Storage::Packed, ++seed, 1.0, nullptr, exact));
    }
}

// SPEC 10 case 12 on both dtypes: q and k of 1.5e19 as `set_qk` makes them.
template <class SetQK> void check_case12(const char *name, float scale, float softcap, SetQK set_qk)
{
    uint64_t seed = seed_for(name, 0);
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16}) {
        std::mt19937_64 rng(++seed);
        AttnConfig c = base(dt, {0, 40, 100}, 2, 1, 16);
        c.scale = scale;
        c.softcap = softcap;
        c.causal = true;
        Problem pb(c, Storage::Packed, rng);
        set_qk(pb, 1.5e19, rng);
        CHECK(check_case(c, Storage::Packed, seed, 1.0, &pb));
    }
}

TEST_CASE("CUDA: SPEC 10 case 12, q and k of 1.5e19 with scale 0.01 (Q scaled first)", "[cuda][spec]")
{
    check_case12("cuda case12", 0.01f, 0.0f, set_equal_logit_qk);
}

TEST_CASE("CUDA: SPEC 10 case 12 with softcap 5, q and k of 1.5e19 at the default scale", "[cuda][spec]")
{
    check_case12("cuda case12 softcap", 0.0f, 5.0f, set_softcap_overflow_qk);
}

TEST_CASE("CUDA: SPEC 10 case 10, dynamic masks: key bias and top-k", "[cuda][dynamic]")
{
    uint64_t seed = seed_for("cuda dynamic", 0);
    // every pair of (dtype, bias heads, keep_k) values, not their whole product: bias heads
    // run through a Latin square over dtype x keep_k (15 configurations instead of 45)
    const int bias_heads[] = {1, 2, 4};
    int dt_index = 0;
    for (ringattn_dtype_t dt : all_dtypes) {
        int keep_index = 0;
        for (int keep : {0, 1, 5, 40, 1000}) { // 1000 >= every length: no selection
            const int hb = bias_heads[(dt_index + keep_index++) % 3];
            std::mt19937_64 rng(++seed);
            AttnConfig c = base(dt, cu_from_lengths({150, 0, 70}), 4, 2, 32);
            c.key_bias_heads = hb;
            c.keep_k = keep;
            set_mask(c, (MaskKind)(rng() % 4), rng);
            CHECK(check_case(c, Storage::Packed, rng()));
            // biases in halves: ties at the threshold (the lower position wins, SPEC 6)
            Problem pb(c, Storage::Packed, rng);
            pb.set_bias(quantized(pb.cfg.bias));
            CHECK(check_case(pb.cfg, Storage::Packed, rng(), 1.0, &pb));
        }
        ++dt_index;
    }
}

TEST_CASE("CUDA: SPEC 10 case 7, plan scratch left by earlier calls changes nothing", "[cuda][spec]")
{
    // One plan, calls with different inputs in turn: each result is its own inputs' (the
    // kernels never read the previous call's state).
    for (ringattn_dtype_t dt : all_dtypes) {
        AttnConfig c = base(dt, {0, 90, 200}, 2, 1, 32);
        c.causal = true, c.wl = 30;
        Plan plan(c);
        require_plan(plan);
        CheckOptions opt;
        opt.backward = false;
        for (uint64_t s = 0; s < 3; ++s) {
            std::mt19937_64 rng(seed_for("cuda case7", s));
            Problem pb(c, Storage::Packed, rng, 1.0 + (double)s);
            CHECK(check_against_oracle(plan, pb, opt));
        }
    }
}

TEST_CASE("CUDA: SPEC 10 case 8, gradients against finite differences in float64", "[cuda][fd]")
{
    // The float64 oracle's backward against central differences of its forward at the kernels'
    // smallest head dims (D = D_v = 8; lengths 7, 6, 1 against 7, 3, 2: fewer keys than queries,
    // so causal rows without keys, SPEC 10 cases 3 and 5), then the library's float32 gradients
    // against that oracle on inputs of the same case (SPEC 9).
    const FdCase cases[] = {
        {"plain, H_b = H", false, -1, -1, 0.0f, false, 0.0f, 2, 2, 2, 0},
        {"causal+window, GQA, softcap, H_b = H_kv", true, 3, -1, 2.0f, false, 0.0f, 4, 2, 2, 0},
        {"two-sided window, MQA, softcap, ALiBi, scale, H_b = 1", false, 2, 1, 3.0f, true, 0.7f, 4, 1, 1, 0},
    };
    uint64_t seed = seed_for("cuda fd", 0);
    for (const FdCase &fc : cases) {
        AttnConfig c = fd_config(fc, 0);
        c.D = c.Dv = 8;
        std::mt19937_64 rng(++seed);
        c.bias = std::vector<double>((size_t)(c.key_bias_heads * c.Tk()));
        for (double &b : c.bias) b = std::normal_distribution<double>(0.0, 1.0)(rng);
        INFO(fc.name << ": " << c.describe());
        const FdGradients g = fd_gradients(c, rng, fd_sigma_qk(fc));
        CHECK(norm_rel_err(g.oracle.dQ, g.nq) <= 1e-7);
        CHECK(norm_rel_err(g.oracle.dK, g.nk) <= 1e-7);
        CHECK(norm_rel_err(g.oracle.dV, g.nv) <= 1e-7);
        CHECK(norm_rel_err(g.oracle.dBias, g.nbias) <= 1e-7);
        CHECK(check_case(c, Storage::Packed, ++seed, fd_sigma_qk(fc)));
    }
}
