// The emulation's performance counters (emu/counters.h) on kernels of known
// behaviour: bank conflicts and broadcasts of shared loads, coalesced and scattered global
// loads, useful and wasted mma, barriers, shuffles, cp.async groups in flight and ldmatrix with
// and without conflicts; and counting changes no result.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "emu/counters.h"
#include "tests/emu/counter_kernels.cuh"

namespace {

// The value of "field":N in a counters line (-1: absent).
long long field(const std::string &json, const std::string &name)
{
    const std::string key = "\"" + name + "\":";
    const size_t at = json.find(key);
    return at == std::string::npos ? -1 : std::atoll(json.c_str() + at + key.size());
}

// The counters of the launch `run` makes (counting on for it only).
template <class Run> std::string counted(Run run)
{
    ra_emu::counting_on = true;
    int st = 0;
    run(st);
    REQUIRE(st == 0);
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
    ra_emu::counting_on = false;
    return ra_emu::counters_last();
}

} // namespace

TEST_CASE("counters: shared loads by the bank rule (conflict-free, broadcast, 8-way, 32-way)", "[emu][counters]")
{
    std::vector<float> out(32);
    struct Case {
        int stride, spread;
        long long wavefronts;
    };
    for (const Case c : {Case{1, 0, 1}, Case{0, 0, 1}, Case{32, 0, 32}, Case{0, 8, 8}, Case{2, 0, 2}}) {
        INFO("stride " << c.stride << " spread " << c.spread);
        const std::string j = counted([&](int &st) {
            RA_LAUNCH(st, ra_count_shared_loads, dim3(1), dim3(32), 4096, nullptr, out.data(),
                      c.stride, c.spread);
        });
        INFO(j);
        // the tile's fill: 32 conflict-free stores; then the one load under test
        CHECK(field(j, "ld.shared.b32\":{\"requests") == 1);
        CHECK(field(j, "smem_requests") == 33);
        CHECK(field(j, "smem_wavefronts") == 32 + c.wavefronts);
        CHECK(field(j, "smem_ideal_wavefronts") == 33); // at most 32 distinct words: 1 ideal
        CHECK(field(j, "smem_bytes_read") == 128);
        CHECK(field(j, "smem_bytes_written") == 4096);
    }
}

TEST_CASE("counters: global loads in 32-byte sectors (coalesced, scattered)", "[emu][counters]")
{
    alignas(128) static float in[32 * 8]; // sectors counted from a 32-byte boundary
    std::vector<float> out(32);
    for (const auto &c : {std::pair<int, long long>{1, 4}, {8, 32}, {2, 8}}) {
        const std::string j = counted([&](int &st) {
            RA_LAUNCH(st, ra_count_global_loads, dim3(1), dim3(32), 0, nullptr, in, out.data(),
                      c.first);
        });
        INFO("stride " << c.first << ": " << j);
        CHECK(field(j, "gmem_requests") == 1);
        CHECK(field(j, "gmem_sectors") == c.second);
        CHECK(field(j, "gmem_bytes") == 128);
    }
}

TEST_CASE("counters: loops (each lane's accesses as runs) judged request by request", "[emu][counters]")
{
    alignas(128) static float in[32 + 64];
    std::vector<float> out(32);
    const int n = 16;
    // global: request i starts at byte 4 i, on a sector boundary for i % 8 == 0
    long long sectors = 0;
    for (int i = 0; i < n; ++i) sectors += i % 8 ? 5 : 4;
    for (const int stride : {1, 32}) {
        const std::string j = counted([&](int &st) {
            RA_LAUNCH(st, ra_count_loops, dim3(1), dim3(32), 4096, nullptr, in, out.data(), n,
                      stride, 0);
        });
        INFO("shared stride " << stride << ": " << j);
        CHECK(field(j, "gmem_requests") == n);
        CHECK(field(j, "gmem_sectors") == sectors);
        CHECK(field(j, "gmem_bytes") == 128 * n);
        CHECK(field(j, "ld.shared.b32\":{\"requests") == n);
        CHECK(field(j, "ld.shared.b32\":{\"requests\":16,\"wavefronts") == (stride == 1 ? n : 32 * n));
    }
    // two strides in one warp, and lanes 16-31 stopping half way: requests 0-7 of all 32 lanes,
    // 8-15 of lanes 0-15 only; even lanes step by 32 floats (one bank), odd ones by 64 (the
    // same bank too), so lanes l and l' meet on one bank only where l = l' (stride 1): 1
    // wavefront each; the global window of the upper lanes' last 8 requests is absent
    const std::string j = counted([&](int &st) {
        RA_LAUNCH(st, ra_count_loops, dim3(1), dim3(32), 4096, nullptr, in, out.data(), n, 1, 1);
    });
    INFO(j);
    long long half_sectors = 0; // lanes 0-15 at bytes 4 i .. 4 i + 63
    for (int i = n / 2; i < n; ++i) half_sectors += i % 8 ? 3 : 2;
    long long full_sectors = 0;
    for (int i = 0; i < n / 2; ++i) full_sectors += i % 8 ? 5 : 4;
    CHECK(field(j, "gmem_requests") == n);
    CHECK(field(j, "gmem_sectors") == full_sectors + half_sectors);
    CHECK(field(j, "gmem_bytes") == 128 * (n / 2) + 64 * (n / 2));
    CHECK(field(j, "ld.shared.b32\":{\"requests\":16,\"wavefronts") == n);
}

TEST_CASE("counters: useful and wasted mma, shuffles, barriers, cp.async groups", "[emu][counters]")
{
    std::vector<float> out(128, 1.0f);
    for (int a_zero = 0; a_zero < 2; ++a_zero) {
        const std::string j = counted([&](int &st) {
            RA_LAUNCH(st, ra_count_mma, dim3(3), dim3(32), 1024, nullptr, a_zero, out.data());
        });
        INFO("A zero " << a_zero << ": " << j);
        CHECK(field(j, "mma_issued") == 3); // one per block
        CHECK(field(j, "mma_useful") == (a_zero ? 0 : 3));
        CHECK(field(j, "flops") == 3 * 4096);
        CHECK(field(j, "useful_flops") == (a_zero ? 0 : 3 * 4096));
        CHECK(field(j, "shuffles") == 6);
        CHECK(field(j, "barriers") == 6);
        CHECK(field(j, "max_cp_async_groups") == 2);
        CHECK(field(j, "cp.async.b128\":{\"requests") == 6); // two per block, 512 bytes each
        CHECK(field(j, "grid\":[3,1,1],\"block\":[32,1,1],\"smem") == 1024);
        CHECK(j.find("\"kernel\":\"ra_count_mma\"") != std::string::npos);
    }
}

TEST_CASE("counters: ldmatrix wavefronts per 8x8 matrix", "[emu][counters]")
{
    std::vector<uint32_t> out(32);
    for (const auto &c : {std::pair<int, long long>{16, 4}, {128, 32}}) {
        const std::string j = counted([&](int &st) {
            RA_LAUNCH(st, ra_count_ldmatrix, dim3(1), dim3(32), 8192, nullptr, c.first, out.data());
        });
        INFO("rows " << c.first << " bytes apart: " << j);
        CHECK(field(j, "ldmatrix.x4\":{\"requests") == 1);
        CHECK(field(j, "ldmatrix.x4\":{\"requests\":1,\"wavefronts") == c.second);
        const std::string ldsm = "ldmatrix.x4\":{\"requests\":1,\"wavefronts\":" + std::to_string(c.second);
        CHECK(field(j, ldsm + ",\"ideal") == 4); // 512 distinct bytes
    }
}

TEST_CASE("counters: counting changes no result, and nothing is counted when off", "[emu][counters]")
{
    std::vector<float> out_on(32), out_off(32);
    const std::string j = counted([&](int &st) {
        RA_LAUNCH(st, ra_count_shared_loads, dim3(1), dim3(32), 4096, nullptr, out_on.data(), 3, 0);
    });
    CHECK(field(j, "smem_requests") == 33);
    int st = 0;
    RA_LAUNCH(st, ra_count_shared_loads, dim3(1), dim3(32), 4096, nullptr, out_off.data(), 3, 0);
    REQUIRE(st == 0);
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
    CHECK(out_on == out_off);
    CHECK(ra_emu::counters_last() == j); // no report of the uncounted launch
}
