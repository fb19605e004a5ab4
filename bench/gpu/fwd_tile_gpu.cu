// The forward tile kernel (kernels/cuda/forward_tile.cuh) on a real GPU, for the H200 check
// (bench/gpu/check.sh; CUDA.md section 4). It drives the kernel directly, so that it needs
// nothing but nvcc on the GPU machine (the library's own GPU tests need OpenBLAS and Catch2,
// which check.sh builds where they are):
//   fwd_tile_gpu test   small shapes against a float64 reference (every row), three runs
//                       compared bitwise; prints one line per case and exits 1 on a failure
//   fwd_tile_gpu bench  forward TFLOP/s at T = 4K and 16K, H = 16, D = 64 and 128, bf16,
//                       full and causal (CUDA events, 3 warm-ups, best of 10)
// Tolerance: the error of O relative to max |V| within 2e-2 (bf16) or 4e-3 (f16), LSE within
// 1e-3 -- a sanity bound; SPEC 9's judgement is the library's tests' (test_cuda_forward).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "kernels/cuda/forward_tile.cuh"

#define CHECK_CUDA(x)                                                                     \
    do {                                                                                  \
        cudaError_t e_ = (x);                                                             \
        if (e_ != cudaSuccess) {                                                          \
            std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
            std::exit(2);                                                                 \
        }                                                                                 \
    } while (0)

namespace {

struct Shape {
    int tq, tk, H, Hkv, D, wl, wr;
    bool bf16;
};

float to_f(uint16_t h, bool bf16) { return bf16 ? ra__bf16_to_f32(h) : ra__f16_to_f32(h); }

template <int D> void launch(const ra_fwd_tile_args &a, int tq, int H, cudaStream_t s)
{
    const size_t smem = ra_fwd_tile_smem(D, D);
    CHECK_CUDA(cudaFuncSetAttribute(ra_fwd_tile_kernel<D, D>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int st = 0;
    RA_LAUNCH(st, (ra_fwd_tile_kernel<D, D>), dim3((unsigned)(tq + 63) / 64, (unsigned)H, 1u),
              dim3(128), smem, s, a);
    CHECK_CUDA((cudaError_t)st);
}

struct Device {
    uint16_t *q, *k, *v, *o;
    float *lse;
    ra_segment *qsegs, *ksegs; // one sequence: one segment each
    int32_t *work, *kseq_first;
    int64_t *delta;
};

// One single-sequence problem on the device; returns its args.
ra_fwd_tile_args make(const Shape &s, const std::vector<uint16_t> &hq, const std::vector<uint16_t> &hk,
                      const std::vector<uint16_t> &hv, Device &d)
{
    const size_t nq = (size_t)s.tq * s.H * s.D, nk = (size_t)s.tk * s.Hkv * s.D;
    CHECK_CUDA(cudaMalloc((void **)&d.q, nq * 2));
    CHECK_CUDA(cudaMalloc((void **)&d.k, nk * 2));
    CHECK_CUDA(cudaMalloc((void **)&d.v, nk * 2));
    CHECK_CUDA(cudaMalloc((void **)&d.o, nq * 2));
    CHECK_CUDA(cudaMalloc((void **)&d.lse, (size_t)s.H * s.tq * 4));
    // the segment model (masks/shard.h): one segment per shard, the query tiles listed
    const ra_segment qs = {ra_span{0, 0, 1, s.tq}, 0}, ks = {ra_span{0, 0, 1, s.tk}, 0};
    std::vector<int32_t> work;
    for (int t0 = 0; t0 < s.tq; t0 += 64) work.push_back(0), work.push_back(t0);
    const int32_t kseq_first[2] = {0, 1};
    CHECK_CUDA(cudaMalloc((void **)&d.qsegs, sizeof qs));
    CHECK_CUDA(cudaMalloc((void **)&d.ksegs, sizeof ks));
    CHECK_CUDA(cudaMalloc((void **)&d.work, work.size() * 4));
    CHECK_CUDA(cudaMalloc((void **)&d.kseq_first, 8));
    CHECK_CUDA(cudaMalloc((void **)&d.delta, 8));
    CHECK_CUDA(cudaMemcpy(d.qsegs, &qs, sizeof qs, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d.ksegs, &ks, sizeof ks, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d.work, work.data(), work.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d.kseq_first, kseq_first, 8, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d.q, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d.k, hk.data(), nk * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d.v, hv.data(), nk * 2, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(d.o, 0xff, nq * 2)); // poisoned
    const int64_t delta = s.tk - s.tq;
    CHECK_CUDA(cudaMemcpy(d.delta, &delta, 8, cudaMemcpyHostToDevice));
    ra_fwd_tile_args a{};
    a.q = d.q, a.k = d.k, a.v = d.v, a.o = d.o, a.lse = d.lse;
    a.q_row = (int64_t)s.H * s.D, a.q_head = s.D, a.k_row = (int64_t)s.Hkv * s.D, a.k_head = s.D;
    a.v_row = a.k_row, a.v_head = s.D, a.o_row = a.q_row, a.o_head = s.D;
    a.qsegs = d.qsegs, a.ksegs = d.ksegs, a.work = d.work, a.kseq_first = d.kseq_first;
    a.delta = d.delta;
    a.tq = s.tq, a.heads = s.H, a.kv_heads = s.Hkv, a.d = s.D, a.dv = s.D;
    a.window = ra_window{s.wl, s.wr}, a.scale = 1.0f / std::sqrt((float)s.D);
    a.first = a.last = 1, a.bf16 = s.bf16;
    return a;
}

void release(Device &d)
{
    for (void *p : {(void *)d.q, (void *)d.k, (void *)d.v, (void *)d.o, (void *)d.lse,
                    (void *)d.qsegs, (void *)d.ksegs, (void *)d.work, (void *)d.kseq_first,
                    (void *)d.delta})
        cudaFree(p);
}

void run(const Shape &s, const ra_fwd_tile_args &a, cudaStream_t st)
{
    if (s.D == 64) launch<64>(a, s.tq, s.H, st);
    else launch<128>(a, s.tq, s.H, st);
}

int test()
{
    const Shape shapes[] = {{100, 150, 4, 2, 64, -1, -1, true}, {130, 130, 2, 1, 64, -1, 0, true},
                            {90, 60, 2, 2, 64, -1, 0, false}, {70, 200, 2, 1, 64, 17, 3, true},
                            {65, 97, 2, 1, 128, -1, 0, true}, {300, 300, 2, 1, 128, 40, 0, false}};
    int bad = 0;
    for (const Shape &s : shapes) {
        std::mt19937 rng(7);
        std::normal_distribution<float> n01;
        auto fill = [&](size_t n) {
            std::vector<uint16_t> v(n);
            for (auto &x : v) x = s.bf16 ? ra__f32_to_bf16(n01(rng)) : ra__f32_to_f16(n01(rng));
            return v;
        };
        const auto hq = fill((size_t)s.tq * s.H * s.D), hk = fill((size_t)s.tk * s.Hkv * s.D),
                   hv = fill((size_t)s.tk * s.Hkv * s.D);
        Device d{};
        const ra_fwd_tile_args a = make(s, hq, hk, hv, d);
        std::vector<uint16_t> o[3];
        std::vector<float> lse((size_t)s.H * s.tq);
        for (int r = 0; r < 3; ++r) {
            run(s, a, nullptr);
            CHECK_CUDA(cudaDeviceSynchronize());
            o[r].resize((size_t)s.tq * s.H * s.D);
            CHECK_CUDA(cudaMemcpy(o[r].data(), d.o, o[r].size() * 2, cudaMemcpyDeviceToHost));
        }
        CHECK_CUDA(cudaMemcpy(lse.data(), d.lse, lse.size() * 4, cudaMemcpyDeviceToHost));
        const bool same = !std::memcmp(o[0].data(), o[1].data(), o[0].size() * 2) &&
                          !std::memcmp(o[0].data(), o[2].data(), o[0].size() * 2);
        double err = 0, lse_err = 0, vmax = 0;
        for (uint16_t x : hv) vmax = std::fmax(vmax, std::fabs(to_f(x, s.bf16)));
        const double scale = 1.0 / std::sqrt((double)s.D);
        const int64_t delta = s.tk - s.tq;
        for (int h = 0; h < s.H; ++h)
            for (int i = 0; i < s.tq; ++i) {
                const int hk_ = h / (s.H / s.Hkv);
                std::vector<double> p(s.tk, 0.0);
                double mx = -INFINITY;
                for (int j = 0; j < s.tk; ++j) {
                    const int64_t diag = i + delta;
                    if ((s.wl >= 0 && j < diag - s.wl) || (s.wr >= 0 && j > diag + s.wr)) {
                        p[j] = -INFINITY;
                        continue;
                    }
                    double z = 0;
                    for (int c = 0; c < s.D; ++c)
                        z += (double)to_f(hq[((size_t)i * s.H + h) * s.D + c], s.bf16) *
                             to_f(hk[((size_t)j * s.Hkv + hk_) * s.D + c], s.bf16);
                    p[j] = z * scale;
                    mx = std::fmax(mx, p[j]);
                }
                double sum = 0;
                for (int j = 0; j < s.tk; ++j) sum += p[j] == -INFINITY ? 0 : std::exp(p[j] - mx);
                for (int c = 0; c < s.D; ++c) {
                    double acc = 0;
                    for (int j = 0; j < s.tk; ++j)
                        if (p[j] != -INFINITY)
                            acc += std::exp(p[j] - mx) / sum *
                                   to_f(hv[((size_t)j * s.Hkv + hk_) * s.D + c], s.bf16);
                    const double got = to_f(o[0][((size_t)i * s.H + h) * s.D + c], s.bf16);
                    err = std::fmax(err, sum == 0 ? std::fabs(got) : std::fabs(got - acc) / vmax);
                }
                const double ref_lse = sum == 0 ? -INFINITY : mx + std::log(sum);
                const double gl = lse[(size_t)h * s.tq + i];
                lse_err = std::fmax(lse_err, ref_lse == -INFINITY ? (gl == -INFINITY ? 0 : 1)
                                                                 : std::fabs(gl - ref_lse));
            }
        const bool ok = same && err <= (s.bf16 ? 2e-2 : 4e-3) && lse_err <= 1e-3;
        std::printf("test T_q=%d T_k=%d H=%d/%d D=%d window=(%d,%d) %s: O err %.3g, LSE err %.3g, "
                    "3 runs %s: %s\n",
                    s.tq, s.tk, s.H, s.Hkv, s.D, s.wl, s.wr, s.bf16 ? "bf16" : "f16", err, lse_err,
                    same ? "bitwise equal" : "DIFFER", ok ? "ok" : "FAIL");
        bad += !ok;
        release(d);
    }
    return bad ? 1 : 0;
}

int bench()
{
    std::printf("| T | H | D | mask | ms | TFLOP/s |\n|---|---|---|---|---|---|\n");
    for (int T : {4096, 16384})
        for (int D : {64, 128})
            for (int causal = 0; causal < 2; ++causal) {
                const Shape s{T, T, 16, 16, D, -1, causal ? 0 : -1, true};
                std::vector<uint16_t> hq((size_t)T * 16 * D, ra__f32_to_bf16(0.01f));
                Device d{};
                const ra_fwd_tile_args a = make(s, hq, hq, hq, d);
                cudaEvent_t e0, e1;
                CHECK_CUDA(cudaEventCreate(&e0));
                CHECK_CUDA(cudaEventCreate(&e1));
                for (int w = 0; w < 3; ++w) run(s, a, nullptr);
                float best = 1e30f;
                for (int r = 0; r < 10; ++r) {
                    CHECK_CUDA(cudaEventRecord(e0));
                    run(s, a, nullptr);
                    CHECK_CUDA(cudaEventRecord(e1));
                    CHECK_CUDA(cudaEventSynchronize(e1));
                    float ms;
                    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
                    best = ms < best ? ms : best;
                }
                const double flop = 4.0 * T * (double)T * 16 * D * (causal ? 0.5 : 1.0);
                std::printf("| %d | 16 | %d | %s | %.3f | %.1f |\n", T, D, causal ? "causal" : "full",
                            best, flop / (best * 1e-3) / 1e12);
                cudaEventDestroy(e0);
                cudaEventDestroy(e1);
                release(d);
            }
    return 0;
}

} // namespace

int main(int argc, char **argv)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        std::printf("fwd_tile_gpu: no CUDA device visible: skipped\n");
        return 77;
    }
    const bool bench_mode = argc > 1 && !std::strcmp(argv[1], "bench");
    return bench_mode ? bench() : test();
}
