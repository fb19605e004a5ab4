// The CUDA backend's own single-rank catalogue, forward and backward, through the public API
// (the shared catalogue, SPEC 10 included, runs on it as every <test>_cuda_emu): RATEST_BACKEND=
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

using namespace ratest;

namespace {

// c under storage st against the oracle (schedule 0), then again under a second schedule: the
// same bits. The second is random (1) or, for every other seed, the highest thread first (2):
// each warp then runs ahead to its next barrier, where a barrier missing between a shared
// tile's last read and its next write gives other bits.
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
    set_schedule(seed % 2 ? 1 : 2, seed);
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
        for (const Mask &m : masks)
            for (ringattn_precision_t level : {RINGATTN_PRECISION_DEFAULT, RINGATTN_PRECISION_HIGH}) {
                if (dt == RINGATTN_FLOAT32 && level == RINGATTN_PRECISION_HIGH) continue; // the same
                std::mt19937_64 rng(++seed);
                AttnConfig c = base(dt, cu_from_lengths({70, 0, 1, 130}), 4, 2);
                apply(c, m);
                c.precision = level; // SPEC 9: each level against its own plain reference
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
            if (d.d + d.dv < 384) continue;
            // the largest shapes' feature kernels at SPEC 9's high level: the tensor-core
            // backward's largest shared memory (Q and dO single-buffered on an A100 and for
            // the feature kernel on an H200; the SIMT backward where even that does not fit)
            c.softcap = 30.0f, c.alibi = alibi_slopes(c.H), c.precision = RINGATTN_PRECISION_HIGH;
            CHECK(check_case(c, Storage::Packed, ++seed, 2.5));
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

TEST_CASE("CUDA: lengths off the kernels' tiles, under two schedules", "[cuda]")
{
    // SPEC 10 case 5 at the CUDA tiles: lengths 1, 7, 63, 65, 129 (not multiples of the 64 or
    // 32 tiles). The SPEC 10 cases themselves run on every backend (test_spec_cases,
    // test_dynamic_spec, test_dynamic_fd); here they meet the second schedule.
    uint64_t seed = seed_for("cuda case2", 0);
    for (ringattn_dtype_t dt : all_dtypes)
        CHECK(check_case(base(dt, cu_from_lengths({1, 7, 63, 65, 129}), 2, 1, 32),
                         Storage::Packed, ++seed));
}
