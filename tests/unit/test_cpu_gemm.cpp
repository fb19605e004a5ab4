// The CPU backend's own tile products (kernels/cpu/bf16_gemm.c on AVX512-BF16, f32_gemm.c on
// AVX-512): every transpose combination and ragged M, N, K (odd K: a zero-padded bfloat16 pair;
// M and N off the 8 x 32 blocks) against a float64 product, within float32 accumulation error:
// of the bfloat16-rounded operands; with A split in two bfloat16 parts, of A as it is, within
// that and the low part's rounding (2^-16 relative: the high part is truncated); in float32,
// of the operands as they are. C's elements outside [M, N] untouched; a NaN reaches its row
// only, an infinity stays one; the same call gives the same bits. A kernel the CPU cannot run
// is skipped with a warning.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "support/half.hpp"

using ratest::round_to_bf16;

extern "C" int ratest_gemm_supported(int kind);
extern "C" int ratest_gemm(int kind, int max_dim, int trans_a, int trans_b, int M, int N, int K,
                           float alpha, const float *A, long lda, const float *B, long ldb,
                           float beta, float *C, long ldc);

namespace {

const char *const KERNELS[] = {"bfloat16", "bfloat16, A split", "float32"};

struct Product {
    int kind, ta, tb, M, N, K;
    float alpha, beta;
    long lda, ldb, ldc;
    std::vector<float> A, B, C;
};

// op(X)[i][j] of a row-major X with leading dimension ld
float at(const std::vector<float> &X, long ld, bool trans, int i, int j)
{
    return trans ? X[(size_t)j * ld + i] : X[(size_t)i * ld + j];
}

Product make(std::mt19937 &gen, int kind, int ta, int tb, int M, int N, int K, float beta)
{
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    Product p{kind, ta, tb, M, N, K, 0.37f, beta, 0, 0, 0, {}, {}, {}};
    p.lda = (ta ? M : K) + 3;
    p.ldb = (tb ? K : N) + 5;
    p.ldc = N + 7;
    p.A.resize((size_t)(ta ? K : M) * p.lda);
    p.B.resize((size_t)(tb ? N : K) * p.ldb);
    for (float &x : p.A) x = u(gen);
    for (float &x : p.B) x = u(gen);
    p.C.assign((size_t)M * p.ldc, std::numeric_limits<float>::quiet_NaN());
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) p.C[(size_t)i * p.ldc + j] = beta != 0.0f ? u(gen) : NAN;
    return p;
}

std::vector<float> run(const Product &p)
{
    std::vector<float> C = p.C;
    REQUIRE(ratest_gemm(p.kind, 300, p.ta, p.tb, p.M, p.N, p.K, p.alpha, p.A.data(), p.lda,
                             p.B.data(), p.ldb, p.beta, C.data(), p.ldc) == 0);
    return C;
}

} // namespace

TEST_CASE("tile products against float64", "[cpu_gemm]")
{
    std::mt19937 gen(std::random_device{}());
    const int sizes[][3] = {{1, 1, 1},   {8, 32, 2},    {7, 33, 5},    {9, 31, 64},
                            {17, 64, 129}, {256, 256, 128}, {64, 80, 255}, {3, 200, 1}};
    for (int kind = 0; kind < 3; ++kind) {
    if (!ratest_gemm_supported(kind)) {
        WARN("skipped " << KERNELS[kind] << ": this CPU cannot run it");
        continue;
    }
    int checked = 0;
    for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb)
            for (const auto &s : sizes)
                for (float beta : {0.0f, 1.0f}) {
                    const Product p = make(gen, kind, ta, tb, s[0], s[1], s[2], beta);
                    const std::vector<float> C = run(p);
                    double worst = 0.0;
                    for (int i = 0; i < p.M; ++i) {
                        for (int j = 0; j < p.N; ++j) {
                            double ref = 0.0, mag = 0.0;
                            for (int k = 0; k < p.K; ++k) {
                                const float a = at(p.A, p.lda, ta, i, k);
                                const float b = at(p.B, p.ldb, tb, k, j);
                                const double t = (double)(kind == 0 ? round_to_bf16(a) : a) *
                                                 (kind == 2 ? b : round_to_bf16(b));
                                ref += t;
                                mag += std::fabs(t);
                            }
                            const double c0 = p.C[(size_t)i * p.ldc + j];
                            ref = p.alpha * ref + (beta != 0.0f ? c0 : 0.0);
                            mag = p.alpha * mag + (beta != 0.0f ? std::fabs(c0) : 0.0);
                            const double err = std::fabs(C[(size_t)i * p.ldc + j] - ref);
                            const double bound =
                                ((p.K + 3) * 0x1p-24 + (kind == 1 ? 0x1p-16 : 0.0)) * mag + 1e-30;
                            worst = std::max(worst, err / bound);
                        }
                        for (long j = p.N; j < p.ldc; ++j) // past N: untouched
                            REQUIRE(std::isnan(C[(size_t)i * p.ldc + j]));
                    }
                    INFO(KERNELS[kind] << " trans " << ta << tb << " M " << p.M << " N "
                                  << p.N << " K " << p.K << " beta " << beta);
                    CHECK(worst <= 1.0);
                    const std::vector<float> again = run(p);
                    CHECK(std::memcmp(again.data(), C.data(), C.size() * sizeof(float)) == 0);
                    ++checked;
                }
    CHECK(checked == 4 * 8 * 2);
    }
}

TEST_CASE("a NaN operand reaches its row of C and no other", "[cpu_gemm]")
{
    std::mt19937 gen(7);
    for (int kind = 0; kind < 3; ++kind)
    for (int ta = 0; ta < 2 && ratest_gemm_supported(kind); ++ta) {
        Product p = make(gen, kind, ta, 1, 20, 40, 33, 0.0f);
        const int row = 13, k = 32; // the padded pair's real half
        (ta ? p.A[(size_t)k * p.lda + row] : p.A[(size_t)row * p.lda + k]) = NAN;
        const std::vector<float> C = run(p);
        for (int i = 0; i < p.M; ++i)
            for (int j = 0; j < p.N; ++j)
                REQUIRE(std::isnan(C[(size_t)i * p.ldc + j]) == (i == row));
    }
}

TEST_CASE("a split A and float32 keep infinities and the largest floats", "[cpu_gemm]")
{
    std::mt19937 gen(11);
    for (int kind = 1; kind < 3; ++kind)
    for (int ta = 0; ta < 2 && ratest_gemm_supported(kind); ++ta) {
        Product p = make(gen, kind, ta, 0, 12, 20, 9, 0.0f);
        auto a = [&](int i, int k) -> float & {
            return ta ? p.A[(size_t)k * p.lda + i] : p.A[(size_t)i * p.lda + k];
        };
        a(3, 4) = INFINITY;                     // inf, not inf - inf = NaN
        a(5, 8) = 3.4e38f;                      // rounds to inf in bfloat16; truncated it does not
        for (float &x : p.B) x *= 1e-30f;
        const std::vector<float> C = run(p);
        for (int j = 0; j < p.N; ++j) {
            INFO("trans " << ta << " column " << j);
            REQUIRE(std::isinf(C[3 * p.ldc + j]));
            REQUIRE(std::isfinite(C[5 * p.ldc + j]));
            const float b = p.B[(size_t)8 * p.ldb + j];
            const double want = p.alpha * 3.4e38 * (kind == 2 ? b : round_to_bf16(b));
            CHECK(std::fabs(C[5 * p.ldc + j] - want) <= 1e-3 * std::fabs(want) + 1e-6);
        }
    }
}
