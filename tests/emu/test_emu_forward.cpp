// The forward kernel core (kernels/cuda/forward_tile.cuh) on the emulation: bf16 and f16, D 64
// and 128, GQA, a window with bottom-right alignment, rows with no allowed key, query and key
// counts that are not multiples of the tiles, and the keys split over two ring steps (the
// running state through device memory). Judged against the float64 oracle with SPEC 9's rule,
// outputs poisoned, under two scheduling policies compared bitwise.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/forward_tile.cuh"
#include "support/cases.hpp"
#include "support/spec9.hpp"

namespace {

struct Out {
    std::vector<uint16_t> o;
    std::vector<float> lse;
};

const uint16_t *rows_of(const ratest::TView &t, int64_t row)
{
    return reinterpret_cast<const uint16_t *>(t.buf->bytes.data()) + t.off + row * t.rs;
}

// The problem through the kernel, its keys split over two ring steps at key `split` of every
// sequence (split = 0: one step).
template <int D, int DV> Out run(const ratest::Problem &pb, int split, ra_emu::Policy policy)
{
    const ratest::AttnConfig &c = pb.cfg;
    const int tq = (int)c.Tq(), H = c.H, n = c.num_seqs();
    Out out{std::vector<uint16_t>((size_t)tq * H * DV, 0xffff),
            std::vector<float>((size_t)H * tq, NAN)};
    std::vector<float> m((size_t)H * tq, NAN), l(m.size(), NAN), acc(m.size() * DV, NAN);
    std::vector<float> slopes(c.alibi.begin(), c.alibi.end());
    ra_emu::set_policy(policy, 9);
    const int steps = split > 0 ? 2 : 1;
    int longest = 0;
    for (int s = 0; s < n; ++s) longest = std::max(longest, c.cu_q[s + 1] - c.cu_q[s]);
    for (int step = 0; step < steps; ++step) {
        // this step's keys of each sequence: [0, split) then [split, L_k), positions relative
        std::vector<int32_t> cu_k(1, 0);
        std::vector<int64_t> delta;
        std::vector<uint16_t> k, v; // packed copies of this step's keys
        for (int s = 0; s < n; ++s) {
            const int lk = c.cuk()[s + 1] - c.cuk()[s], lq = c.cu_q[s + 1] - c.cu_q[s];
            const int from = steps == 1 ? 0 : step == 0 ? 0 : std::min(split, lk);
            const int to = steps == 1 ? lk : step == 0 ? std::min(split, lk) : lk;
            for (int j = from; j < to; ++j) {
                const uint16_t *kr = rows_of(pb.k, c.cuk()[s] + j), *vr = rows_of(pb.v, c.cuk()[s] + j);
                k.insert(k.end(), kr, kr + (size_t)c.hkv() * D);
                v.insert(v.end(), vr, vr + (size_t)c.hkv() * DV);
            }
            cu_k.push_back(cu_k.back() + (to - from));
            delta.push_back((int64_t)(lk - lq) - from);
        }
        k.push_back(0), v.push_back(0); // never empty
        ra_fwd_tile_args a{};
        a.q = rows_of(pb.q, 0), a.k = k.data(), a.v = v.data();
        a.q_row = pb.q.rs, a.q_head = pb.q.hs, a.k_row = (int64_t)c.hkv() * D, a.k_head = D;
        a.v_row = (int64_t)c.hkv() * DV, a.v_head = DV;
        a.o = out.o.data(), a.o_row = (int64_t)H * DV, a.o_head = DV, a.lse = out.lse.data();
        a.m = m.data(), a.l = l.data(), a.acc = acc.data();
        a.cu_q = c.cu_q.data(), a.cu_k = cu_k.data(), a.delta = delta.data();
        a.tq = tq, a.heads = H, a.kv_heads = c.hkv();
        a.window_left = c.wl, a.window_right = c.eff_wr();
        a.scale = (float)c.eff_scale(), a.softcap = c.softcap;
        a.inv_softcap = c.softcap > 0 ? 1.0f / c.softcap : 0.0f;
        a.alibi = slopes.empty() ? nullptr : slopes.data();
        a.first = step == 0, a.last = step == steps - 1, a.bf16 = c.dtype == RINGATTN_BFLOAT16;
        int st = 0;
        RA_LAUNCH(st, (ra_fwd_tile_kernel<D, DV>), dim3((unsigned)(longest + 63) / 64, (unsigned)H, (unsigned)n),
                  dim3(128), ra_fwd_tile_smem(D, DV), nullptr, a);
        REQUIRE(st == 0);
        const cudaError_t e = cudaStreamSynchronize(nullptr);
        INFO(ra_emu::last_error());
        REQUIRE(e == cudaSuccess);
    }
    ra_emu::set_policy(ra_emu::Policy::round_robin);
    return out;
}

ratest::Got got_of(const ratest::Problem &pb, const Out &r, int D)
{
    const ratest::AttnConfig &c = pb.cfg;
    ratest::Got g;
    g.O = ratest::Dense(c.Tq(), c.H, D);
    for (size_t i = 0; i < r.o.size(); ++i) {
        float f;
        ra__load_f32(&f, &r.o[i], c.dtype, 1);
        g.O.v[i] = f;
    }
    g.lse.assign(r.lse.begin(), r.lse.end());
    return g;
}

template <int D, int DV = D> void check_case(ratest::AttnConfig c, int split, uint64_t seed)
{
    c.D = D, c.Dv = DV;
    const ratest::Problem pb = ratest::packed_problem(c, seed);
    const Out a = run<D, DV>(pb, split, ra_emu::Policy::round_robin);
    const Out b = run<D, DV>(pb, split, ra_emu::Policy::random);
    INFO(c.describe() << ", split at key " << split);
    CHECK(std::memcmp(a.o.data(), b.o.data(), a.o.size() * 2) == 0);
    CHECK(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0);
    ratest::Spec9Options opt;
    opt.backward = false;
    opt.label = c.describe();
    CHECK(ratest::spec9_check(c, pb.q.to_dense(), pb.k.to_dense(), pb.v.to_dense(),
                              pb.dout.to_dense(), got_of(pb, a, DV), opt));
}

ratest::AttnConfig config(ringattn_dtype_t dt, std::vector<int32_t> cu_q, std::vector<int32_t> cu_k,
                          int H, int Hkv, int wl, int wr, bool causal)
{
    ratest::AttnConfig c;
    c.dtype = dt, c.H = H, c.Hkv = Hkv, c.cu_q = cu_q, c.cu_k = cu_k;
    c.wl = wl, c.wr = wr, c.causal = causal;
    return c;
}

ratest::AttnConfig config(ringattn_dtype_t dt, int tq, int tk, int H, int Hkv, int wl, int wr,
                          bool causal)
{
    return config(dt, {0, tq}, {0, tk}, H, Hkv, wl, wr, causal);
}

} // namespace

TEST_CASE("emulated forward tile kernel: bf16/f16, GQA, windows, two ring steps, SPEC 9",
          "[emu][forward]")
{
    uint64_t seed = 40;
    for (ringattn_dtype_t dt : {RINGATTN_BFLOAT16, RINGATTN_FLOAT16}) {
        check_case<64>(config(dt, 100, 150, 4, 2, -1, -1, false), 70, seed++);  // full, GQA
        check_case<64>(config(dt, 130, 130, 2, 1, -1, -1, true), 64, seed++);   // causal, MQA
        check_case<64>(config(dt, 90, 60, 2, 2, -1, -1, true), 20, seed++);     // delta < 0: empty rows
        check_case<64>(config(dt, 70, 200, 2, 1, 17, 3, false), 150, seed++);   // window, KV cache
        check_case<128>(config(dt, 65, 97, 2, 1, -1, -1, true), 33, seed++);
        // the window hull at tile boundaries: row 64's diagonal opens key tile 64 (causal), and
        // a window (1, 0) makes row 64 reach back to key 63 in tile 0
        check_case<64>(config(dt, 65, 65, 1, 1, -1, -1, true), 0, seed++);
        check_case<64>(config(dt, 100, 100, 1, 1, 1, -1, true), 0, seed++);
    }
}

TEST_CASE("emulated forward tile kernel: packed varlen batches, softcap, ALiBi, D_v != D",
          "[emu][forward]")
{
    uint64_t seed = 80;
    for (ringattn_dtype_t dt : {RINGATTN_BFLOAT16, RINGATTN_FLOAT16}) {
        // sequences of 70, 0 (empty), 130 and 5 queries; keys 90, 3, 130, 0 (a row with none)
        auto varlen = config(dt, {0, 70, 70, 200, 205}, {0, 90, 93, 223, 223}, 4, 2, -1, -1, true);
        check_case<64>(varlen, 0, seed++);
        auto capped = config(dt, 100, 120, 2, 1, 30, -1, false);
        capped.softcap = 5.0f;
        check_case<64>(capped, 50, seed++);
        auto alibi = config(dt, 90, 90, 2, 2, -1, -1, true);
        alibi.alibi = {0.25f, 0.0625f};
        check_case<64, 128>(alibi, 40, seed++);
        auto both = config(dt, {0, 40, 140}, {0, 40, 140}, 2, 1, 25, 0, false);
        both.softcap = 3.0f;
        both.alibi = {0.5f, 0.125f};
        check_case<128, 64>(both, 0, seed++);
    }
}
