// The SIMT emulation's self-tests (DESIGN: CUDA: the SIMT emulation): the fragment tables give the
// plain product exactly, a block reduction is exact, and every kind of misuse the emulation
// promises to catch is caught -- with a report naming the call sites, or as a bitwise difference
// between scheduling policies.
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

// The report of a launch that must fail when its stream is drained (the device is reset after).
template <class Launch> std::string error_of(Launch launch)
{
    int st = 0;
    launch(st);
    if (st == 0) st = (int)cudaStreamSynchronize(nullptr);
    const std::string e = st == 0 ? std::string("(launch succeeded)")
                                  : std::string(ra_emu::last_error()) + " [" +
                                        cudaGetErrorString((cudaError_t)st) + "]";
    cudaDeviceReset();
    return e;
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
        REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
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
        REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
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
        REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
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

TEST_CASE("a thread that exits with cp.async copies in flight fails the launch", "[emu]")
{
    std::vector<float> in(128, 1.0f);
    const std::string e = error_of([&](int &st) {
        RA_LAUNCH(st, ra_test_cp_async_exit, dim3(1), dim3(32), 128 * sizeof(float), nullptr,
                  in.data());
    });
    INFO(e);
    CHECK(has(e, "thread 3 exited with 1 cp.async copies in flight"));
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
        REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
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

TEST_CASE("a launch above the shared-memory limit is refused at once", "[emu]")
{
    std::vector<float> in(64), out(64);
    int st = 0;
    // RA_LAUNCH opts in above 48 KiB; past the device's 227 KiB the opt-in itself fails
    RA_LAUNCH(st, ra_test_neighbour, dim3(1), dim3(64), ra_emu::max_dynamic_smem + 16, nullptr,
              in.data(), out.data(), 1);
    CHECK(st == (int)cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess);
    // above 48 KiB without the opt-in (a launch that bypasses RA_LAUNCH) fails as on a GPU
    const cudaError_t e = ra_emu::launch_kernel("ra_test_neighbour", nullptr, dim3(1), dim3(64), 64 * 1024,
                                                ra_test_neighbour, in.data(), out.data(), 1);
    CHECK(e == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess);
}

// Stream 1 doubles x into y; stream 2 adds y into z. Without an event recorded on stream 1 and
// waited for on stream 2 the result depends on the order the streams drain in.
TEST_CASE("a missing event between two streams shows as a difference between drain orders",
          "[emu]")
{
    const ra_emu::Drain orders[] = {ra_emu::Drain::in_order, ra_emu::Drain::reverse,
                                    ra_emu::Drain::round_robin, ra_emu::Drain::random};
    for (int with_event = 1; with_event >= 0; --with_event) {
        std::vector<std::vector<float>> outs;
        for (ra_emu::Drain d : orders) {
            ra_emu::set_drain_policy(d, 5);
            cudaStream_t s1, s2;
            cudaEvent_t done;
            REQUIRE(cudaStreamCreate(&s1) == cudaSuccess);
            REQUIRE(cudaStreamCreate(&s2) == cudaSuccess);
            REQUIRE(cudaEventCreate(&done) == cudaSuccess);
            float *x, *y, *z;
            REQUIRE(cudaMalloc((void **)&x, 64 * 4) == cudaSuccess);
            REQUIRE(cudaMalloc((void **)&y, 64 * 4) == cudaSuccess);
            REQUIRE(cudaMalloc((void **)&z, 64 * 4) == cudaSuccess);
            std::vector<float> host(64);
            for (int i = 0; i < 64; ++i) host[i] = (float)i;
            REQUIRE(cudaMemcpy(x, host.data(), 64 * 4, cudaMemcpyHostToDevice) == cudaSuccess);
            REQUIRE(cudaMemsetAsync(y, 0, 64 * 4, s1) == cudaSuccess);
            REQUIRE(cudaMemsetAsync(z, 0, 64 * 4, s2) == cudaSuccess);
            int st = 0;
            RA_LAUNCH(st, ra_test_axpy, dim3(1), dim3(64), 0, s1, x, y, 2.0f);
            REQUIRE(st == 0);
            if (with_event) {
                REQUIRE(cudaEventRecord(done, s1) == cudaSuccess);
                REQUIRE(cudaStreamWaitEvent(s2, done) == cudaSuccess);
            }
            RA_LAUNCH(st, ra_test_axpy, dim3(1), dim3(64), 0, s2, y, z, 1.0f);
            REQUIRE(st == 0);
            REQUIRE(cudaStreamSynchronize(s2) == cudaSuccess);
            REQUIRE(cudaMemcpy(host.data(), z, 64 * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
            outs.push_back(host);
            REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
            for (float *p : {x, y, z}) CHECK(cudaFree(p) == cudaSuccess);
            cudaEventDestroy(done);
            cudaStreamDestroy(s1);
            cudaStreamDestroy(s2);
        }
        ra_emu::set_drain_policy(ra_emu::Drain::in_order);
        bool same = true;
        for (auto &o : outs) same = same && std::memcmp(o.data(), outs[0].data(), 64 * 4) == 0;
        INFO("with_event = " << with_event);
        CHECK(same == (with_event == 1));
        if (with_event) CHECK(outs[0][5] == 10.0f);
    }
}
