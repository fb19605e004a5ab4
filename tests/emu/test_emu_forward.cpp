// The forward kernel core (kernels/cuda/forward_tile.cuh) on the emulation: bf16 and f16, D 64
// and 128, GQA, a window with bottom-right alignment, rows with no allowed key, query and key
// counts that are not multiples of the tiles, and the keys split over two ring steps (the
// running state through device memory). Judged against the float64 oracle with SPEC 9's rule,
// outputs poisoned, under two scheduling policies compared bitwise.
#include <catch2/catch.hpp>

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

template <int D> Out run(const ratest::Problem &pb, int split, ra_emu::Policy policy)
{
    const ratest::AttnConfig &c = pb.cfg;
    const int tq = (int)c.Tq(), tk = (int)c.Tk(), H = c.H;
    Out out{std::vector<uint16_t>((size_t)tq * H * D, 0xffff), std::vector<float>((size_t)H * tq, NAN)};
    std::vector<float> m((size_t)H * tq, NAN), l(m.size(), NAN), acc(m.size() * D, NAN);
    ra_emu::set_policy(policy, 9);
    const int bounds[3] = {0, split, tk};
    for (int step = 0; step < 2; ++step) {
        const int k0 = bounds[step], nk = bounds[step + 1] - k0;
        ra_fwd_tile_args a{};
        a.q = rows_of(pb.q, 0), a.k = rows_of(pb.k, k0), a.v = rows_of(pb.v, k0);
        a.q_row = pb.q.rs, a.q_head = pb.q.hs, a.k_row = pb.k.rs, a.k_head = pb.k.hs;
        a.v_row = pb.v.rs, a.v_head = pb.v.hs;
        a.o = out.o.data(), a.o_row = (int64_t)H * D, a.o_head = D, a.lse = out.lse.data();
        a.m = m.data(), a.l = l.data(), a.acc = acc.data();
        a.tq = tq, a.tk = nk, a.heads = H, a.kv_heads = c.hkv();
        a.delta = (int64_t)(tk - tq) - k0; // SPEC 2, positions relative to this step's keys
        a.window_left = c.wl, a.window_right = c.eff_wr();
        a.scale = (float)c.eff_scale();
        a.first = step == 0, a.last = step == 1, a.bf16 = c.dtype == RINGATTN_BFLOAT16;
        int st = 0;
        RA_LAUNCH(st, ra_fwd_tile_kernel<D>, dim3((unsigned)(tq + 63) / 64, (unsigned)H), dim3(128),
                  ra_fwd_tile_smem(D), nullptr, a);
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

template <int D> void check_case(ratest::AttnConfig c, int split, uint64_t seed)
{
    c.D = D;
    const ratest::Problem pb = ratest::packed_problem(c, seed);
    const Out a = run<D>(pb, split, ra_emu::Policy::round_robin);
    const Out b = run<D>(pb, split, ra_emu::Policy::random);
    INFO(c.describe() << ", split at key " << split);
    CHECK(std::memcmp(a.o.data(), b.o.data(), a.o.size() * 2) == 0);
    CHECK(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0);
    ratest::Spec9Options opt;
    opt.backward = false;
    opt.label = c.describe();
    CHECK(ratest::spec9_check(c, pb.q.to_dense(), pb.k.to_dense(), pb.v.to_dense(),
                              pb.dout.to_dense(), got_of(pb, a, D), opt));
}

ratest::AttnConfig config(ringattn_dtype_t dt, int tq, int tk, int H, int Hkv, int wl, int wr,
                          bool causal)
{
    ratest::AttnConfig c;
    c.dtype = dt, c.H = H, c.Hkv = Hkv, c.cu_q = {0, tq}, c.cu_k = {0, tk};
    c.wl = wl, c.wr = wr, c.causal = causal;
    return c;
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
    }
}
