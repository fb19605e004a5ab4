// The forward kernel core (kernels/cuda/forward_tile.cuh) on the emulation: bf16 and f16, D 64
// and 128, GQA, a window with bottom-right alignment, rows with no allowed key, query and key
// counts that are not multiples of the tiles, and the keys split over two ring steps (the
// running state through device memory). Judged against the float64 oracle with SPEC 9's rule,
// outputs poisoned, under two scheduling policies compared bitwise (the second run with V
// single-buffered where that kernel exists: an A100's pipeline at D = D_v = 128).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/forward_f32.cuh"
#include "kernels/cuda/forward_tile.cuh"
#include "support/cases.hpp"
#include "support/spec9.hpp"

namespace {

struct Out {
    std::vector<unsigned char> o; // [T_q, H, D_v] of the dtype
    std::vector<float> lse;
};

size_t elem_of(ringattn_dtype_t dt) { return dt == RINGATTN_FLOAT32 ? 4 : 2; }

const unsigned char *rows_of(const ratest::TView &t, int64_t row)
{
    return t.buf->bytes.data() + (size_t)(t.off + row * t.rs) * elem_of(t.buf->dtype);
}

// A rank's tokens under a layout of SPEC 8 as segments (masks/shard.h): contiguous (one chunk
// of each sequence), zigzag (chunks r and 2P - 1 - r of 2P), striped (positions r, r + P, ...).
struct Shard {
    std::vector<ra_segment> segs;
    std::vector<int32_t> seq_first;
    int64_t rows = 0;
    ra_shard sh{};
    const ra_shard &view() // as masks/shard.h holds it
    {
        sh = ra_shard{(int)segs.size(), segs.data(), seq_first.data(), rows};
        return sh;
    }
};

Shard make_shard(ringattn_layout_t layout, int P, int r, const std::vector<int32_t> &cu)
{
    Shard sh;
    const int n = (int)cu.size() - 1;
    auto add = [&](int s, int64_t pos, int64_t stride, int64_t count) {
        if (count <= 0) return;
        sh.segs.push_back(ra_segment{ra_span{s, pos, stride, count}, sh.rows});
        sh.rows += count;
    };
    for (int s = 0; s < n; ++s) {
        sh.seq_first.push_back((int32_t)sh.segs.size());
        const int64_t L = cu[s + 1] - cu[s];
        auto chunk = [&](int c, int of) { return L * c / of; };
        if (layout == RINGATTN_LAYOUT_STRIPED) add(s, r, P, r < L ? (L - r + P - 1) / P : 0);
        else if (layout == RINGATTN_LAYOUT_ZIGZAG) {
            add(s, chunk(r, 2 * P), 1, chunk(r + 1, 2 * P) - chunk(r, 2 * P));
            add(s, chunk(2 * P - 1 - r, 2 * P), 1, chunk(2 * P - r, 2 * P) - chunk(2 * P - 1 - r, 2 * P));
        } else add(s, chunk(r, P), 1, chunk(r + 1, P) - chunk(r, P));
    }
    sh.seq_first.push_back((int32_t)sh.segs.size());
    return sh;
}

// A shard's rows of a global [T, heads, dim] tensor, packed (bytes of its dtype).
std::vector<unsigned char> gather_rows(const ratest::TView &t, const Shard &sh,
                                       const std::vector<int32_t> &cu)
{
    std::vector<unsigned char> out;
    const size_t w = (size_t)t.heads * t.dim * elem_of(t.buf->dtype);
    for (const ra_segment &g : sh.segs)
        for (int64_t j = 0; j < g.span.count; ++j) {
            const unsigned char *row = rows_of(t, cu[g.span.seq] + g.span.pos + j * g.span.stride);
            out.insert(out.end(), row, row + w);
        }
    out.resize(out.size() + 16, 0); // never empty
    return out;
}

// The problem through the kernel as a ring of P ranks under a layout (P = 1: one rank, every
// key): rank r's queries meet the key shards of ranks r, r - 1, ... in P steps, the running
// state between them in device memory. O and LSE gathered in global order.
template <int D, int DV>
Out run(const ratest::Problem &pb, ringattn_layout_t layout, int P, ra_emu::Policy policy, int vbuf)
{
    const ratest::AttnConfig &c = pb.cfg;
    const int tq = (int)c.Tq(), H = c.H, n = c.num_seqs();
    const size_t e = elem_of(c.dtype);
    Out out{std::vector<unsigned char>((size_t)tq * H * DV * e, 0xff),
            std::vector<float>((size_t)H * tq, NAN)};
    std::vector<float> slopes(c.alibi.begin(), c.alibi.end());
    std::vector<int64_t> delta;
    for (int s = 0; s < n; ++s)
        delta.push_back((int64_t)(c.cuk()[s + 1] - c.cuk()[s]) - (c.cu_q[s + 1] - c.cu_q[s]));
    ra_emu::set_policy(policy, 9);
    for (int r = 0; r < P; ++r) {
        Shard qs = make_shard(layout, P, r, c.cu_q);
        const std::vector<unsigned char> q = gather_rows(pb.q, qs, c.cu_q);
        const int64_t rows = qs.rows;
        std::vector<unsigned char> o(((size_t)rows * H * DV + 1) * e, 0xff); // poisoned
        std::vector<float> lse((size_t)H * rows + 1, NAN), m(lse), l(lse), acc(lse.size() * DV, NAN);
        for (int step = 0; step < P; ++step) {
            Shard ks = make_shard(layout, P, (r - step + P) % P, c.cuk());
            const std::vector<unsigned char> k = gather_rows(pb.k, ks, c.cuk()),
                                             v = gather_rows(pb.v, ks, c.cuk());
            // the key bias of this shard's rows, [H_b, rows] (SPEC 6)
            std::vector<float> bias;
            for (int hb = 0; hb < c.key_bias_heads; ++hb)
                for (const ra_segment &g : ks.segs)
                    for (int64_t j = 0; j < g.span.count; ++j)
                        bias.push_back(pb.bias_buf[(size_t)hb * c.Tk() + c.cuk()[g.span.seq] +
                                                   g.span.pos + j * g.span.stride]);
            // the tile list as a plan makes it (masks/tiles.h), its items heaviest first
            const ra_window window{c.wl, c.eff_wr()};
            const bool f32 = c.dtype == RINGATTN_FLOAT32;
            const bool full = c.softcap > 0 || !slopes.empty() || c.key_bias_heads; // the library's choice
            const int bq = f32 ? ra_fwd32::BQ : ra__cuda_query_tile(D, full);
            const int bk = f32 ? ra_fwd32::BK : ra__cuda_keys_per_tile(D);
            ra_tile_list list;
            REQUIRE(ra__tile_list_make(window, delta.data(), &qs.view(), 1, bq, &ks.view(), bk,
                                       &list) == RINGATTN_SUCCESS);
            std::vector<ra_tile_item> items;
            for (int32_t j = 0; j < list.num_items; ++j) items.push_back(list.items[list.order[j]]);
            const std::vector<ra_tile_run> runs(list.runs, list.runs + list.num_runs);
            ra__tile_list_free(&list);
            ra_attn_args a{};
            a.q = q.data(), a.k = k.data(), a.v = v.data();
            a.q_row = (int64_t)H * D, a.q_head = D, a.k_row = (int64_t)c.hkv() * D, a.k_head = D;
            a.v_row = (int64_t)c.hkv() * DV, a.v_head = DV;
            a.o = o.data(), a.o_row = (int64_t)H * DV, a.o_head = DV, a.lse = lse.data();
            a.m = m.data(), a.l = l.data(), a.acc = acc.data();
            a.qsegs = qs.segs.data(), a.ksegs = ks.segs.data(), a.delta = delta.data();
            a.items = items.data(), a.runs = runs.data();
            a.tq = (int)rows, a.heads = H, a.kv_heads = c.hkv(), a.d = D, a.dv = DV;
            a.window = window;
            a.scale = (float)c.eff_scale(), a.softcap = c.softcap;
            a.softcap_scale = c.softcap > 0 ? a.scale / c.softcap : 0.0f;
            a.alibi = slopes.empty() ? nullptr : slopes.data();
            a.bias = c.key_bias_heads ? bias.data() : nullptr;
            a.bias_ld = ks.rows, a.bias_heads = c.key_bias_heads;
            a.first = step == 0, a.last = step == P - 1, a.bf16 = c.dtype == RINGATTN_BFLOAT16;
            a.full_features = full;
            if (items.empty()) continue;
            int st = 0;
            const dim3 grid((unsigned)items.size(), (unsigned)H);
            if (f32)
                RA_LAUNCH(st, (ra_fwd_f32_kernel<D, DV>), grid, dim3(ra_fwd32::THREADS), ra_fwd_f32_smem(D, DV),
                          nullptr, a);
            else if (a.bf16)
                st = full ? ra_fwd_tile_launch<true, D, DV, true>(a, grid, nullptr, vbuf)
                          : ra_fwd_tile_launch<true, D, DV, false>(a, grid, nullptr, vbuf);
            else
                st = full ? ra_fwd_tile_launch<false, D, DV, true>(a, grid, nullptr, vbuf)
                          : ra_fwd_tile_launch<false, D, DV, false>(a, grid, nullptr, vbuf);
            REQUIRE(st == 0);
            const cudaError_t e = cudaStreamSynchronize(nullptr);
            INFO(ra_emu::last_error());
            REQUIRE(e == cudaSuccess);
        }
        int64_t row = 0; // back to global rows
        for (const ra_segment &g : qs.segs)
            for (int64_t j = 0; j < g.span.count; ++j, ++row) {
                const int64_t gr = c.cu_q[g.span.seq] + g.span.pos + j * g.span.stride;
                std::memcpy(&out.o[(size_t)gr * H * DV * e], &o[(size_t)row * H * DV * e],
                            (size_t)H * DV * e);
                for (int h = 0; h < H; ++h)
                    out.lse[(size_t)h * tq + gr] = lse[(size_t)h * rows + row];
            }
    }
    ra_emu::set_policy(ra_emu::Policy::round_robin);
    return out;
}

ratest::Got got_of(const ratest::Problem &pb, const Out &r, int D)
{
    const ratest::AttnConfig &c = pb.cfg;
    ratest::Got g;
    g.O = ratest::Dense(c.Tq(), c.H, D);
    const size_t e = elem_of(c.dtype);
    for (size_t i = 0; i < g.O.v.size(); ++i) {
        float f;
        ra__load_f32(&f, &r.o[i * e], c.dtype, 1);
        g.O.v[i] = f;
    }
    g.lse.assign(r.lse.begin(), r.lse.end());
    return g;
}

// The problem on P ranks under a layout (P = 1: one rank), under two scheduling policies; the
// second with V single-buffered where that kernel exists (the pipelines differ, the arithmetic
// not: bitwise equal).
template <int D, int DV = D>
void check_case(ratest::AttnConfig c, int P, uint64_t seed,
                ringattn_layout_t layout = RINGATTN_LAYOUT_CONTIGUOUS)
{
    c.D = D, c.Dv = DV;
    const ratest::Problem pb = ratest::packed_problem(c, seed);
    const Out a = run<D, DV>(pb, layout, P, ra_emu::Policy::round_robin, 2);
    const Out b = run<D, DV>(pb, layout, P, ra_emu::Policy::random, 1);
    INFO(c.describe() << ", " << P << " ranks, layout " << layout);
    CHECK(std::memcmp(a.o.data(), b.o.data(), a.o.size()) == 0);
    CHECK(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * 4) == 0);
    ratest::Spec9Options opt;
    opt.backward = false;
    opt.label = c.describe();
    CHECK(ratest::spec9_check(pb.cfg, pb.q.to_dense(), pb.k.to_dense(), pb.v.to_dense(),
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

TEST_CASE("emulated forward tile kernel: bf16/f16, GQA, windows, two ranks, SPEC 9",
          "[emu][forward]")
{
    uint64_t seed = 40;
    for (ringattn_dtype_t dt : {RINGATTN_BFLOAT16, RINGATTN_FLOAT16}) {
        check_case<64>(config(dt, 100, 150, 4, 2, -1, -1, false), 2, seed++);  // full, GQA
        check_case<64>(config(dt, 130, 130, 2, 1, -1, -1, true), 2, seed++);   // causal, MQA
        check_case<64>(config(dt, 90, 60, 2, 2, -1, -1, true), 2, seed++);     // delta < 0: empty rows
        check_case<64>(config(dt, 70, 200, 2, 1, 17, 3, false), 2, seed++);   // window, KV cache
        check_case<128>(config(dt, 65, 97, 2, 1, -1, -1, true), 2, seed++);
        check_case<128>(config(dt, {0, 150, 290}, {0, 170, 330}, 2, 1, 45, 0, false), 2, seed++); // varlen, window
        // the window hull at tile boundaries: row 64's diagonal opens key tile 64 (causal), and
        // a window (1, 0) makes row 64 reach back to key 63 in tile 0
        check_case<64>(config(dt, 65, 65, 1, 1, -1, -1, true), 1, seed++);
        check_case<64>(config(dt, 100, 100, 1, 1, 1, -1, true), 1, seed++);
    }
}

TEST_CASE("emulated forward tile kernel: packed varlen batches, softcap, ALiBi, D_v != D",
          "[emu][forward]")
{
    uint64_t seed = 80;
    for (ringattn_dtype_t dt : {RINGATTN_BFLOAT16, RINGATTN_FLOAT16}) {
        // sequences of 70, 0 (empty), 130 and 5 queries; keys 90, 3, 130, 0 (a row with none)
        auto varlen = config(dt, {0, 70, 70, 200, 205}, {0, 90, 93, 223, 223}, 4, 2, -1, -1, true);
        check_case<64>(varlen, 1, seed++);
        auto capped = config(dt, 100, 120, 2, 1, 30, -1, false);
        capped.softcap = 5.0f;
        check_case<64>(capped, 2, seed++);
        auto alibi = config(dt, 90, 90, 2, 2, -1, -1, true);
        alibi.alibi = {0.25f, 0.0625f};
        check_case<64, 128>(alibi, 2, seed++);
        auto both = config(dt, {0, 40, 140}, {0, 40, 140}, 2, 1, 25, 0, false);
        both.softcap = 3.0f;
        both.alibi = {0.5f, 0.125f};
        check_case<128, 64>(both, 1, seed++);
    }
}

TEST_CASE("emulated forward tile kernel: every layout's shards as a ring of 2 and 3 ranks",
          "[emu][forward]")
{
    uint64_t seed = 120;
    for (ringattn_layout_t layout : {RINGATTN_LAYOUT_CONTIGUOUS, RINGATTN_LAYOUT_ZIGZAG,
                                     RINGATTN_LAYOUT_STRIPED})
        for (int P : {2, 3}) {
            check_case<64>(config(RINGATTN_BFLOAT16, {0, 150, 230}, {0, 150, 230}, 2, 1, -1, -1, true),
                           P, seed++, layout);
            check_case<64>(config(RINGATTN_FLOAT16, 200, 200, 2, 2, 37, 0, false), P, seed++, layout);
        }
}

TEST_CASE("emulated forward tile kernel: head dims 32 and 256 (D_v <= 128)", "[emu][forward]")
{
    uint64_t seed = 140;
    check_case<32>(config(RINGATTN_BFLOAT16, 100, 130, 2, 1, -1, -1, true), 2, seed++);
    check_case<256, 64>(config(RINGATTN_BFLOAT16, 70, 90, 2, 1, 30, -1, false), 2, seed++);
    check_case<256, 128>(config(RINGATTN_FLOAT16, 80, 80, 2, 2, -1, -1, true), 1, seed++);
}

TEST_CASE("emulated float32 forward kernel (FFMA): masks, varlen, layouts, SPEC 9's float32 limit",
          "[emu][forward][f32]")
{
    uint64_t seed = 160;
    const ringattn_dtype_t f32 = RINGATTN_FLOAT32;
    check_case<64>(config(f32, 100, 150, 4, 2, -1, -1, false), 2, seed++);
    check_case<64>(config(f32, 90, 60, 2, 2, -1, -1, true), 1, seed++); // rows with no key
    auto varlen = config(f32, {0, 70, 70, 200, 205}, {0, 90, 93, 223, 223}, 4, 2, 20, 0, false);
    varlen.softcap = 4.0f;
    varlen.alibi = {0.25f, 0.125f, 0.0625f, 0.5f};
    check_case<64, 128>(varlen, 1, seed++);
    for (ringattn_layout_t layout : {RINGATTN_LAYOUT_ZIGZAG, RINGATTN_LAYOUT_STRIPED})
        check_case<128, 64>(config(f32, 160, 160, 2, 1, -1, -1, true), 3, seed++, layout);
}

TEST_CASE("emulated forward kernels: the SPEC 6 key bias of 1, H_kv or H heads", "[emu][forward]")
{
    uint64_t seed = 180;
    for (int hb : {1, 2, 4})
        for (ringattn_dtype_t dt : {RINGATTN_BFLOAT16, RINGATTN_FLOAT32}) {
            auto c = config(dt, {0, 90, 170}, {0, 90, 170}, 4, 2, 30, 0, false);
            c.key_bias_heads = hb;
            c.softcap = hb == 2 ? 6.0f : 0.0f;
            c.alibi = hb == 4 ? std::vector<float>{0.1f, 0.2f, 0.05f, 0.0f} : std::vector<float>{};
            check_case<64>(c, 2, seed++, RINGATTN_LAYOUT_STRIPED);
        }
}
