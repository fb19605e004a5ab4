// The SIMT emulation's self-tests (CUDA.md section 2): the fragment tables give the plain
// product exactly, a block reduction is exact, and every kind of misuse the emulation promises
// to catch is caught -- with a report naming the call sites, or as a bitwise difference between
// scheduling policies.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/emu/emu_test_kernels.cuh"

namespace {

const ra_emu::Policy all_policies[] = {ra_emu::Policy::round_robin, ra_emu::Policy::lowest_first,
                                       ra_emu::Policy::highest_first, ra_emu::Policy::random};

// "file:line" of the line of this test's kernels marked SITE_<name>.
std::string site_of(const std::string &name)
{
    const std::string file = "tests/emu/emu_test_kernels.cuh";
    std::ifstream in(std::string(RA_SOURCE_DIR) + "/" + file);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
        if (line.find("SITE_" + name) != std::string::npos)
            return "emu_test_kernels.cuh:" + std::to_string(n);
    return "(no SITE_" + name + ")";
}

uint16_t to_bf16(float f) // exact for the values used here
{
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

template <class Launch> std::string error_of(Launch launch)
{
    int st = 0;
    launch(st);
    return st == 0 ? std::string("(launch succeeded)") : std::string(ra_emu::last_error());
}

bool has(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

} // namespace

TEST_CASE("emulated ldmatrix + mma.m16n8k16 give the plain product exactly", "[emu]")
{
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> d(-16, 16); // multiples of 1/8: every product and sum exact
    for (int trans = 0; trans < 2; ++trans) {
        std::vector<float> A(256), B(256); // B[k][n]
        std::vector<uint16_t> a(256), b(256);
        for (int i = 0; i < 256; ++i) A[i] = d(rng) / 8.0f, B[i] = d(rng) / 8.0f;
        for (int i = 0; i < 256; ++i) a[i] = to_bf16(A[i]);
        for (int k = 0; k < 16; ++k)
            for (int n = 0; n < 16; ++n)
                b[trans ? k * 16 + n : n * 16 + k] = to_bf16(B[k * 16 + n]);
        std::vector<float> C(256, NAN);
        int st = 0;
        RA_LAUNCH(st, ra_test_mma, dim3(1), dim3(32), 1024, nullptr, a.data(), b.data(),
                  (bool)trans, C.data());
        INFO(ra_emu::last_error());
        REQUIRE(st == 0);
        int wrong = 0;
        for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 16; ++j) {
                double want = 0;
                for (int k = 0; k < 16; ++k) want += (double)A[i * 16 + k] * B[k * 16 + j];
                wrong += C[i * 16 + j] != (float)want;
            }
        INFO("ldmatrix" << (trans ? ".trans" : ""));
        CHECK(wrong == 0);
    }
}

TEST_CASE("an emulated two-level block reduction is exact and the same under every policy",
          "[emu]")
{
    std::vector<float> in(256);
    for (int i = 0; i < 256; ++i) in[i] = (float)(i * 3 - 200);
    float want = 0;
    for (float x : in) want += x;
    std::vector<float> first;
    for (ra_emu::Policy p : all_policies) {
        ra_emu::set_policy(p, 11);
        std::vector<float> out(2, NAN);
        int st = 0;
        RA_LAUNCH(st, ra_test_block_sum, dim3(2), dim3(128), 0, nullptr, in.data(), out.data());
        REQUIRE(st == 0);
        CHECK(out[0] == [&] { float s = 0; for (int i = 0; i < 128; ++i) s += in[i]; return s; }());
        CHECK(out[0] + out[1] == want);
        if (first.empty()) first = out;
        CHECK(std::memcmp(first.data(), out.data(), 8) == 0);
    }
    ra_emu::set_policy(ra_emu::Policy::round_robin);
}

TEST_CASE("a missing __syncthreads shows as a bitwise difference between policies", "[emu]")
{
    std::vector<float> in(64);
    for (int i = 0; i < 64; ++i) in[i] = (float)i;
    for (int with_barrier = 1; with_barrier >= 0; --with_barrier) {
        std::vector<std::vector<float>> outs;
        for (ra_emu::Policy p : all_policies) {
            ra_emu::set_policy(p, 3);
            std::vector<float> out(64, 0.0f);
            int st = 0;
            RA_LAUNCH(st, ra_test_neighbour, dim3(1), dim3(64), 64 * sizeof(float), nullptr,
                      in.data(), out.data(), with_barrier);
            REQUIRE(st == 0);
            outs.push_back(out);
        }
        bool same = true;
        for (auto &o : outs) same = same && std::memcmp(o.data(), outs[0].data(), 64 * 4) == 0;
        INFO("with_barrier = " << with_barrier);
        CHECK(same == (with_barrier == 1));
        if (with_barrier) CHECK(outs[0][0] == 2.0f);
    }
    ra_emu::set_policy(ra_emu::Policy::round_robin);
}

TEST_CASE("a barrier half the block takes is a deadlock report naming the site", "[emu]")
{
    std::vector<float> out(64);
    const std::string e = error_of([&](int &st) {
        RA_LAUNCH(st, ra_test_half_barrier, dim3(1), dim3(64), 0, nullptr, out.data());
    });
    INFO(e);
    CHECK(has(e, "deadlock"));
    CHECK(has(e, "0-31: __syncthreads at " + site_of("half_barrier")));
    CHECK(has(e, "32-63: exited"));
}

TEST_CASE("two halves at two barriers are a divergence report naming both sites", "[emu]")
{
    std::vector<float> out(64);
    const std::string e = error_of([&](int &st) {
        RA_LAUNCH(st, ra_test_split_barrier, dim3(1), dim3(64), 0, nullptr, out.data());
    });
    INFO(e);
    CHECK(has(e, "divergent __syncthreads"));
    CHECK(has(e, site_of("split_a")));
    CHECK(has(e, site_of("split_b")));
}

TEST_CASE("a full-mask shuffle inside if (lane < 16) is reported with its site", "[emu]")
{
    std::vector<float> out(32);
    const std::string e = error_of([&](int &st) {
        RA_LAUNCH(st, ra_test_partial_shuffle, dim3(1), dim3(32), 0, nullptr, out.data());
    });
    INFO(e);
    CHECK(has(e, "deadlock"));
    CHECK(has(e, "0-15: a warp collective at " + site_of("partial_shfl")));
    CHECK(has(e, "16-31: exited"));
}

TEST_CASE("a thread that returns before a barrier is reported", "[emu]")
{
    std::vector<float> out(32);
    const std::string e = error_of([&](int &st) {
        RA_LAUNCH(st, ra_test_early_return, dim3(1), dim3(32), 0, nullptr, out.data());
    });
    INFO(e);
    CHECK(has(e, "0-4: __syncthreads at " + site_of("early_barrier")));
    CHECK(has(e, "5: exited"));
    CHECK(has(e, "6-31: __syncthreads at " + site_of("early_barrier")));
}

TEST_CASE("cp.async lands only at its wait: a missing wait reads poisoned shared memory", "[emu]")
{
    std::vector<float> in(128);
    for (int i = 0; i < 128; ++i) in[i] = (float)i;
    for (int wait = 1; wait >= 0; --wait) {
        std::vector<float> out(128, 0.0f);
        int st = 0;
        RA_LAUNCH(st, ra_test_cp_async, dim3(1), dim3(32), 128 * sizeof(float), nullptr,
                  in.data(), out.data(), wait);
        REQUIRE(st == 0);
        int nan = 0, right = 0;
        for (int t = 0; t < 32; ++t)
            for (int i = 0; i < 4; ++i) {
                nan += std::isnan(out[4 * t + i]);
                right += out[4 * t + i] == in[4 * ((t + 1) % 32) + i];
            }
        INFO("wait = " << wait);
        CHECK(right == (wait ? 128 : 0));
        CHECK(nan == (wait ? 0 : 128));
    }
}

TEST_CASE("a misaligned ldmatrix row is reported with its site", "[emu]")
{
    std::vector<uint32_t> out(32);
    const std::string e = error_of([&](int &st) {
        RA_LAUNCH(st, ra_test_misaligned_ldmatrix, dim3(1), dim3(32), 1024, nullptr, out.data());
    });
    INFO(e);
    CHECK(has(e, "ldmatrix.x4 at " + site_of("misaligned")));
    CHECK(has(e, "not 16-byte aligned"));
}

TEST_CASE("a launch above the shared-memory limit is refused", "[emu]")
{
    std::vector<float> in(64), out(64);
    const std::string e = error_of([&](int &st) {
        RA_LAUNCH(st, ra_test_neighbour, dim3(1), dim3(64), ra_emu::max_dynamic_smem + 16,
                  nullptr, in.data(), out.data(), 1);
    });
    CHECK(has(e, "above the limit"));
}
