// Forward (O, LSE) and backward (dQ, dK, dV) of the public API against the float64 oracle under
// SPEC 9's tolerances, on random shapes: ragged sequences (lengths 0 and 1 included), GQA, D_v != D,
// every dtype, mask, softcap, ALiBi, scale, stride layout, tile size and thread count. Every
// output is poisoned with NaN before each call (SPEC 10 case 7); see support/shim.cpp.
#include <catch2/catch.hpp>

#include <random>

#include "support/cases.hpp"

using namespace ratest;

namespace {

const MaskKind all_masks[] = {MaskKind::None, MaskKind::Causal, MaskKind::Window, MaskKind::CausalWindow, MaskKind::HugeWindow, MaskKind::Narrow};

// Random problem; `maxlen` bounds each sequence's query length.
AttnConfig random_config(std::mt19937_64 &rng, ringattn_dtype_t dt, int maxlen)
{
    AttnConfig c;
    c.dtype = dt;
    const int G = pick(rng, {1, 2, 4, 8});
    c.Hkv = G == 8 ? 1 : pick(rng, {1, 2});
    c.H = G * c.Hkv;
    c.D = pick(rng, {32, 64, 80, 128, 256});
    c.Dv = rng() % 3 == 0 ? pick(rng, {16, 48, 64, 80, 256}) : 0;
    if (c.D >= 128 && c.H > 4) { // keep the oracle cheap at large head dims
        c.Hkv = 1;
        c.H = 4;
    }
    const int nseq = 1 + (int)(rng() % 4);
    const std::vector<int> lq = ragged(rng, nseq, maxlen);
    c.cu_q = cu_from_lengths(lq);
    set_random_keys(c, lq, rng);
    set_mask(c, all_masks[rng() % 6], rng);
    set_random_logit_options(c, rng);
    c.block_q = pick(rng, {0, 1, 7, 32, 64, 256, 512});
    c.block_k = pick(rng, {0, 1, 7, 32, 64, 256, 512});
    if (c.block_q == 1 && c.block_k == 1) c.block_k = 7; // keep the 1x1 tiling cheap
    c.num_threads = pick(rng, {1, 2});
    return c;
}

// support/cases.hpp's run_case (no bias in this file).
void run_case(const AttnConfig &c, Storage st, std::mt19937_64 &rng, double sigma_qk = 1.0,
              bool determinism = false)
{
    CaseOpts o;
    o.st = st;
    o.sigma_qk = sigma_qk;
    o.determinism = determinism;
    ratest::run_case(c, rng, o);
}

} // namespace

TEST_CASE("random shapes, masks and options, float32", "[fwd][bwd]")
{
    for (int it = 0; it < 100; ++it) {
        std::mt19937_64 rng(seed_for("fb-random-f32", (uint64_t)it));
        AttnConfig c = random_config(rng, RINGATTN_FLOAT32, 120);
        run_case(c, random_storage(rng, c), rng, c.softcap > 0 ? 2.5 : 1.0);
    }
}

TEST_CASE("random shapes, masks and options, float16 and bfloat16", "[fwd][bwd][half]")
{
    for (int it = 0; it < 60; ++it) {
        std::mt19937_64 rng(seed_for("fb-random-half", (uint64_t)it));
        AttnConfig c = random_config(rng, it % 2 ? RINGATTN_BFLOAT16 : RINGATTN_FLOAT16, 100);
        if (it % 4 >= 2) c.precision = RINGATTN_PRECISION_HIGH; // both levels of SPEC 9
        run_case(c, random_storage(rng, c), rng, c.softcap > 0 ? 2.5 : 1.0);
    }
}

TEST_CASE("every head dim, GQA ratio and D_v", "[fwd][bwd]")
{
    int idx = 0;
    for (int D : {32, 64, 80, 128, 256})
        for (int G : {1, 2, 4, 8}) {
            std::mt19937_64 rng(seed_for("fb-dims", (uint64_t)idx++));
            AttnConfig c;
            c.D = D;
            c.Dv = pick(rng, {0, 0, 16, 64, 200, 256});
            c.Hkv = D >= 128 ? 1 : pick(rng, {1, 2});
            c.H = G * c.Hkv;
            c.cu_q = cu_from_lengths(ragged(rng, 2, D >= 128 ? 70 : 110));
            c.causal = idx % 2;
            c.num_threads = 2;
            run_case(c, Storage::Packed, rng);
        }
}

TEST_CASE("every dtype with every mask, softcap on and off", "[fwd][bwd][half]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (MaskKind m : all_masks)
            for (bool cap : {false, true}) {
                std::mt19937_64 rng(seed_for("fb-dtype-mask", (uint64_t)idx++));
                AttnConfig c;
                c.dtype = dt;
                c.H = 4;
                c.Hkv = 2;
                c.D = 64;
                c.Dv = 48;
                std::vector<int> lq = {1 + (int)(rng() % 90), 0, 1, 2 + (int)(rng() % 150)}, lk = lq;
                if (m == MaskKind::Narrow) lk = {lq[0] / 2, 3, 0, std::max(0, lq[3] - 5)}; // fewer keys: empty rows
                c.cu_q = cu_from_lengths(lq);
                c.cu_k = cu_from_lengths(lk);
                set_mask(c, m, rng);
                if (cap) c.softcap = 5.0f;
                if (idx % 4 >= 2) c.precision = RINGATTN_PRECISION_HIGH;
                c.block_q = 32;
                c.block_k = 64;
                run_case(c, Storage::Packed, rng, cap ? 3.0 : 1.0);
            }
}

TEST_CASE("SPEC 9's two precision levels on the same problems", "[fwd][bwd][half][precision]")
{
    // Each level judged against its own plain reference: the default one against a flash
    // implementation that rounds P and dS to the storage dtype, HIGH against one that keeps them
    // in float32 (a tighter limit, which rounding P or dS once would exceed).
    int idx = 0;
    for (ringattn_dtype_t dt : {RINGATTN_BFLOAT16, RINGATTN_FLOAT16})
        for (MaskKind m : {MaskKind::None, MaskKind::Causal, MaskKind::Window}) {
            const uint64_t seed = seed_for("fb-precision", (uint64_t)idx++);
            for (ringattn_precision_t level : {RINGATTN_PRECISION_DEFAULT, RINGATTN_PRECISION_HIGH}) {
                std::mt19937_64 rng(seed);
                AttnConfig c;
                c.dtype = dt;
                c.H = 4;
                c.Hkv = 2;
                c.D = 64;
                c.cu_q = cu_from_lengths({sized(300, 140), 0, sized(170, 90)});
                set_mask(c, m, rng);
                c.precision = level;
                run_case(c, Storage::Packed, rng);
            }
        }
}

TEST_CASE("two-sided windows, causal + window and windows at and beyond the length", "[fwd][bwd][mask]")
{
    const int L = 150;
    const int windows[][3] = {// {causal, wl, wr}
                              {0, 5, 3},    {0, 0, 7},     {0, 7, 0},   {0, -1, 4},  {0, 4, -1},
                              {1, 9, -1},   {1, 0, -1},    {1, -1, -1}, {1, L - 1, -1}, {1, L, -1},
                              {0, L, L},    {0, L + 7, 0}, {0, 0, L},   {0, L - 1, L - 1}, {1, 3 * L, 5}};
    int idx = 0;
    for (auto &w : windows)
        for (int blk : {16, 0}) {
            std::mt19937_64 rng(seed_for("fb-windows", (uint64_t)idx++));
            AttnConfig c;
            c.H = 2;
            c.D = 32;
            c.cu_q = cu_from_lengths({L, L / 3});
            c.causal = w[0];
            c.wl = w[1];
            c.wr = w[2];
            c.block_q = c.block_k = blk;
            run_case(c, Storage::Packed, rng);
        }
}

TEST_CASE("rows with no allowed key: fewer keys than queries and narrow windows", "[fwd][bwd][mask]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (int variant = 0; variant < 4; ++variant) {
            std::mt19937_64 rng(seed_for("fb-empty-rows", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 2;
            c.Hkv = 1;
            c.D = 32;
            c.Dv = 16;
            c.cu_q = cu_from_lengths({60, 40, 25});
            c.cu_k = cu_from_lengths({30, 0, 25});
            c.block_q = 8;
            c.block_k = 8;
            set_empty_rows_mask(c, variant);
            run_case(c, Storage::Padded, rng);
        }
}

TEST_CASE("softcap, ALiBi and custom scale", "[fwd][bwd]")
{
    int idx = 0;
    for (float cap : {0.0f, 2.0f, 20.0f})
        for (bool alibi : {false, true})
            for (float scale : {0.0f, 0.05f, 0.9f}) {
                std::mt19937_64 rng(seed_for("fb-logit-options", (uint64_t)idx++));
                AttnConfig c;
                c.H = 8;
                c.Hkv = 2;
                c.D = 40;
                c.Dv = 24;
                c.cu_q = cu_from_lengths(ragged(rng, 3, 100));
                c.cu_k = cu_from_lengths({c.cu_q[1] + 10, c.cu_q[2] - c.cu_q[1], c.cu_q[3] - c.cu_q[2] + 33});
                c.softcap = cap;
                if (alibi) c.alibi = alibi_slopes(c.H);
                c.scale = scale;
                c.causal = idx % 3 == 0;
                c.wl = idx % 2 ? 20 : -1;
                run_case(c, Storage::Packed, rng, 2.0);
            }
}

TEST_CASE("non-packed strides: padded rows and heads, QKV interleaved, zero strides", "[fwd][bwd][strides]")
{
    int idx = 0;
    for (ringattn_dtype_t dt : all_dtypes)
        for (Storage st : {Storage::PackedZero, Storage::Padded, Storage::Interleaved}) {
            std::mt19937_64 rng(seed_for("fb-strides", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 4;
            c.Hkv = 2;
            c.D = 32;
            c.Dv = 40;
            c.cu_q = cu_from_lengths(ragged(rng, 3, 90));
            c.causal = true;
            c.wl = 30;
            c.block_q = 16;
            c.block_k = 32;
            run_case(c, st, rng);
        }
}

TEST_CASE("tile sizes 1, 7, 32, 64, 256, 512 and the default", "[fwd][bwd][blocks]")
{
    const int sizes[] = {1, 7, 32, 64, 256, 512, 0};
    int idx = 0;
    for (int bq : sizes)
        for (int bk : sizes) {
            if (bq == 1 && bk == 1) continue;
            std::mt19937_64 rng(seed_for("fb-blocks", (uint64_t)idx++));
            if (rng() % 3 && !(bq == bk || bq == 0 || bk == 0)) continue; // a third of the mixed pairs
            AttnConfig c;
            c.H = 2;
            c.D = 16;
            c.Dv = 8;
            c.cu_q = cu_from_lengths({(int)(100 + rng() % 200), 1, (int)(rng() % 70)});
            set_mask(c, (MaskKind)(idx % 5), rng);
            c.block_q = bq;
            c.block_k = bk;
            run_case(c, Storage::Packed, rng);
        }
}

TEST_CASE("one and two threads", "[fwd][bwd][threads]")
{
    for (int it = 0; it < 6; ++it)
        for (int threads : {1, 2}) {
            std::mt19937_64 rng(seed_for("fb-threads", (uint64_t)it));
            AttnConfig c = random_config(rng, all_dtypes[it % 3], 140);
            c.num_threads = threads;
            run_case(c, Storage::Packed, rng);
        }
}

TEST_CASE("the thread count changes no bit of any output", "[fwd][bwd][threads][determinism]")
{
    // SPEC 9: 1, 2, 3 and 5 threads; one sequence with few heads too (the backward then cuts
    // each head's queries into ranges: their dK, dV sums must not follow the threads)
    for (int it = 0; it < 8; ++it) {
        std::mt19937_64 rng(seed_for("fb-thread-bits", (uint64_t)it));
        AttnConfig c = random_config(rng, all_dtypes[it % 3], 160);
        if (it % 2) c.cu_q = cu_from_lengths({150 + (int)(rng() % 100)}), c.cu_k.clear();
        c.block_q = pick(rng, {7, 16, 32});
        c.block_k = pick(rng, {7, 16, 32});
        check_thread_counts_change_nothing(c, rng, {2, 3, 5});
    }
}

TEST_CASE("separate cu_seqlens_k with more keys than queries (KV cache, bottom-right)", "[fwd][bwd][kv]")
{
    int idx = 0;
    for (MaskKind m : {MaskKind::None, MaskKind::Causal, MaskKind::CausalWindow, MaskKind::Window})
        for (int rep = 0; rep < 2; ++rep) {
            std::mt19937_64 rng(seed_for("fb-kvcache", (uint64_t)idx++));
            AttnConfig c;
            c.H = 4;
            c.Hkv = 1;
            c.D = 64;
            const std::vector<int> lq = {1, 7, (int)(1 + rng() % 40), 0};
            std::vector<int> lk;
            for (int l : lq) lk.push_back(l + 50 + (int)(rng() % 200));
            c.cu_q = cu_from_lengths(lq);
            c.cu_k = cu_from_lengths(lk);
            set_mask(c, m, rng);
            c.block_k = rep ? 64 : 0;
            run_case(c, Storage::Packed, rng);
        }
}

TEST_CASE("repeated runs are bitwise identical", "[fwd][bwd][determinism]")
{
    // Only a repeat with the same thread count is asserted here (SPEC 9); num_threads 1 vs 2 is
    // compared under the tolerances only, by the other cases.
    for (int it = 0; it < 6; ++it) {
        std::mt19937_64 rng(seed_for("fb-determinism", (uint64_t)it));
        AttnConfig c = random_config(rng, all_dtypes[it % 3], 120);
        c.num_threads = 2;
        run_case(c, Storage::Packed, rng, 1.0, true);
    }
}

TEST_CASE("without a communicator every layout is the single-device result", "[fwd][bwd][layout]")
{
    // SPEC 8 with P = 1: contiguous, zigzag (chunks 0 and 1 on rank 0) and striped all keep every
    // token in order, so the outputs must be bitwise those of the contiguous plan.
    for (int it = 0; it < 3; ++it) {
        std::mt19937_64 rng(seed_for("fb-layout", (uint64_t)it));
        AttnConfig c = random_config(rng, all_dtypes[it], 90);
        c.cu_k.clear();
        c.num_threads = 1;
        Problem pb(c, Storage::Packed, rng);
        Plan base(c);
        REQUIRE(base.ok());
        REQUIRE(check_against_oracle(base, pb));
        const Outputs ref(pb);
        for (ringattn_layout_t lay : {RINGATTN_LAYOUT_ZIGZAG, RINGATTN_LAYOUT_STRIPED}) {
            AttnConfig cl = c;
            cl.layout = lay;
            Plan plan(cl);
            INFO("layout " << (int)lay << ": " << ringattn_last_error() << " config " << c.describe());
            REQUIRE(plan.ok());
            pb.poison_forward_outputs();
            pb.poison_backward_outputs();
            REQUIRE(run_forward(plan, pb) == RINGATTN_SUCCESS);
            REQUIRE(run_backward(plan, pb) == RINGATTN_SUCCESS);
            const Outputs got(pb);
            check_same_forward(got, ref);
            check_same_backward(got, ref);
        }
    }
}

TEST_CASE("odd head dims (1, 3, 255) and D_v far from D", "[fwd][bwd]")
{
    const int dims[][2] = {{1, 1}, {3, 1}, {1, 200}, {3, 5}, {255, 7}, {9, 255}};
    int idx = 0;
    for (auto &d : dims)
        for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16}) {
            std::mt19937_64 rng(seed_for("fb-odd-dims", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 2;
            c.Hkv = 1;
            c.D = backend_dim(d[0]); // CUDA: the nearest multiples of 8, still far apart
            c.Dv = backend_dim(d[1]);
            c.cu_q = cu_from_lengths(ragged(rng, 2, 80));
            c.causal = idx % 2;
            c.block_q = 16;
            c.block_k = 32;
            run_case(c, Storage::Padded, rng);
        }
}

TEST_CASE("empty batches: no sequences, only empty sequences, keys without queries", "[fwd][bwd]")
{
    // Keys that no query sees still get their dK, dV written: exactly 0 (they were NaN).
    int idx = 0;
    for (auto &cu : empty_batches)
        for (bool causal : {false, true}) {
            std::mt19937_64 rng(seed_for("fb-empty", (uint64_t)idx++));
            AttnConfig c;
            c.H = 2;
            c.D = 8;
            c.cu_q = cu[0];
            c.cu_k = cu[1];
            c.causal = causal;
            Problem pb(c, Storage::Packed, rng);
            Plan plan(c);
            require_plan(plan);
            REQUIRE(check_against_oracle(plan, pb));
            bool zero = true;
            for (int64_t t = 0; t < c.Tk(); ++t)
                for (int h = 0; h < c.hkv(); ++h)
                    for (int cc = 0; cc < c.D; ++cc)
                        zero = zero && pb.dk.get(t, h, cc) == 0.0 && pb.dv.get(t, h, cc) == 0.0;
            CHECK(zero);
        }
}

TEST_CASE("sequences longer than the default tile", "[fwd][bwd][blocks]")
{
    // The default tiles are large (hundreds of rows): these lengths make the default tiling
    // itself cut sequences into several ragged tiles.
    int idx = 0;
    for (MaskKind m : all_masks)
        for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16}) {
            std::mt19937_64 rng(seed_for("fb-long", (uint64_t)idx++));
            AttnConfig c;
            c.dtype = dt;
            c.H = 2;
            c.Hkv = 1;
            c.D = 32;
            c.Dv = 16;
            std::vector<int> lq = {300 + (int)(rng() % 420), 1 + (int)(rng() % 40)}, lk = lq;
            if (m == MaskKind::Narrow) lk[0] -= 37;
            if (m == MaskKind::Causal) lk[1] += 500;
            c.cu_q = cu_from_lengths(lq);
            c.cu_k = cu_from_lengths(lk);
            set_mask(c, m, rng);
            c.num_threads = 2;
            run_case(c, Storage::Packed, rng);
        }
}
