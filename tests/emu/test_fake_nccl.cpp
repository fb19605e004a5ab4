// The fake NCCL's self-tests (emu/fake_nccl.cpp, DESIGN: the NCCL transport): ranks as
// threads of one process on the fake runtime's streams. A ring exchange in one group lands every
// message, in both streams' order, under every drain order; all-reduce; a non-blocking
// communicator reports ncclInProgress until every rank has joined; a receive nobody sends never
// completes (its event stays unready while the host polls) until the communicator is aborted,
// after which the streams drain and the buffer is untouched.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "emu/cuda_emu.h"
#include "emu/nccl/nccl.h"

namespace {

void *device_copy(const std::vector<int64_t> &host)
{
    void *d = nullptr;
    REQUIRE(cudaMalloc(&d, host.size() * sizeof(int64_t)) == cudaSuccess);
    REQUIRE(cudaMemcpy(d, host.data(), host.size() * sizeof(int64_t), cudaMemcpyHostToDevice) ==
            cudaSuccess);
    return d;
}

std::vector<int64_t> host_copy(const void *d, size_t n)
{
    std::vector<int64_t> h(n);
    REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(int64_t), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
}

// Runs body(rank, comm, stream) on P threads of one communicator, each with its stream.
template <class F> void on_ranks(int P, F body, bool blocking = true)
{
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    std::vector<std::thread> th;
    std::vector<int> ok((size_t)P, 0);
    for (int r = 0; r < P; ++r)
        th.emplace_back([&, r] {
            ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
            cfg.blocking = blocking ? 1 : 0;
            ncclComm_t comm = nullptr;
            const ncclResult_t init = ncclCommInitRankConfig(&comm, P, id, r, &cfg);
            if (init != (blocking ? ncclSuccess : ncclInProgress)) return;
            cudaStream_t s = nullptr;
            cudaStreamCreate(&s);
            ok[(size_t)r] = body(r, comm, s) ? 1 : 0;
            cudaStreamDestroy(s);
            ncclCommDestroy(comm);
        });
    for (auto &t : th) t.join();
    for (int r = 0; r < P; ++r) {
        INFO("rank " << r);
        CHECK(ok[(size_t)r] == 1);
    }
}

} // namespace

TEST_CASE("fake NCCL: a ring exchange in one group, under every drain order", "[emu][nccl]")
{
    const ra_emu::Drain orders[] = {ra_emu::Drain::in_order, ra_emu::Drain::reverse,
                                    ra_emu::Drain::round_robin, ra_emu::Drain::random};
    for (ra_emu::Drain d : orders)
        for (int P : {1, 2, 4}) {
            INFO("ranks " << P << ", drain " << (int)d);
            ra_emu::set_drain_policy(d, 7);
            on_ranks(P, [P](int r, ncclComm_t comm, cudaStream_t s) {
                const size_t n = 1000;
                std::vector<int64_t> mine(n);
                for (size_t i = 0; i < n; ++i) mine[i] = r * 100000 + (int64_t)i;
                void *send = device_copy(mine), *recv = device_copy(std::vector<int64_t>(n, -1));
                // three rounds through the same buffers: each waits for the last in stream order
                bool good = true;
                for (int round = 0; round < 3; ++round) {
                    ncclGroupStart();
                    ncclSend(send, n, ncclInt64, (r + 1) % P, comm, s);
                    ncclRecv(recv, n, ncclInt64, (r - 1 + P) % P, comm, s);
                    if (ncclGroupEnd() != ncclSuccess) return false;
                    // what arrived goes on next round
                    cudaMemcpyAsync(send, recv, n * sizeof(int64_t), cudaMemcpyDeviceToDevice, s);
                    if (cudaStreamSynchronize(s) != cudaSuccess) return false;
                    const std::vector<int64_t> got = host_copy(recv, n);
                    const int from = ((r - 1 - round) % P + P) % P; // its origin
                    for (size_t i = 0; i < n; ++i) good = good && got[i] == from * 100000 + (int64_t)i;
                }
                cudaFree(send), cudaFree(recv);
                return good;
            });
        }
    ra_emu::set_drain_policy(ra_emu::Drain::in_order);
}

TEST_CASE("fake NCCL: all-reduce sums and minima, in stream order", "[emu][nccl]")
{
    on_ranks(3, [](int r, ncclComm_t comm, cudaStream_t s) {
        void *a = device_copy({r + 1, -r, 10 * r}), *b = device_copy({0, 0, 0});
        ncclAllReduce(a, b, 3, ncclInt64, ncclSum, comm, s);
        ncclAllReduce(a, a, 3, ncclInt64, ncclMin, comm, s);
        cudaStreamSynchronize(s);
        const std::vector<int64_t> sum = host_copy(b, 3), mn = host_copy(a, 3);
        cudaFree(a), cudaFree(b);
        return sum == std::vector<int64_t>{6, -3, 30} && mn == std::vector<int64_t>{1, -2, 0};
    });
}

TEST_CASE("fake NCCL: a non-blocking communicator is in progress until every rank joins", "[emu][nccl]")
{
    on_ranks(2, [](int r, ncclComm_t comm, cudaStream_t) {
        ncclResult_t st = ncclInProgress;
        const auto t0 = std::chrono::steady_clock::now();
        while (st == ncclInProgress && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10)) {
            if (ncclCommGetAsyncError(comm, &st) != ncclSuccess) return false;
            if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return st == ncclSuccess;
    }, false);
}

TEST_CASE("fake NCCL: a receive nobody sends blocks its stream until the comm is aborted", "[emu][nccl]")
{
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    ncclComm_t c0 = nullptr, c1 = nullptr;
    std::thread t0([&] { ncclCommInitRank(&c0, 2, id, 0); });
    REQUIRE(ncclCommInitRank(&c1, 2, id, 1) == ncclSuccess);
    t0.join();
    cudaStream_t s;
    cudaEvent_t done;
    cudaStreamCreate(&s);
    cudaEventCreate(&done);
    void *buf = device_copy({-7, -7});
    REQUIRE(ncclRecv(buf, 2, ncclInt64, 0, c1, s) == ncclSuccess); // rank 0 never sends
    cudaEventRecord(done, s);
    for (int i = 0; i < 20; ++i) { // the host polls, as comm/nccl.c does against its deadline
        CHECK(cudaEventQuery(done) == cudaErrorNotReady);
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ncclResult_t st = ncclSuccess;
    REQUIRE(ncclCommGetAsyncError(c1, &st) == ncclSuccess);
    CHECK(st == ncclSuccess); // nothing failed: the peer is only silent
    REQUIRE(ncclCommAbort(c1) == ncclSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess); // the aborted receive runs as a no-op
    CHECK(cudaEventQuery(done) == cudaSuccess);
    CHECK(host_copy(buf, 2) == std::vector<int64_t>{-7, -7});
    ncclCommDestroy(c0);
    cudaFree(buf);
    cudaEventDestroy(done);
    cudaStreamDestroy(s);
}
