// The backend under test and the memory it reads and writes. RATEST_BACKEND (cpu, cuda; ctest
// sets it per registration, default cpu) picks the backend every test's plans ask for. The
// CPU backend reads the tests' host tensors in place; a device backend gets a device copy of
// each, made before a call and read back after it (Mirror), so every case runs unchanged on
// every backend.
#pragma once

#include <cstddef>
#include <vector>

#include "ringattn.h"

namespace ratest {

ringattn_backend_t test_backend();
const char *test_backend_name();
inline bool on_cuda() { return test_backend() == RINGATTN_BACKEND_CUDA; }

// The library under test was built with this backend ("cpu", "cuda": ringattn_build_info).
bool library_has_backend(const char *name);

// The size tier: the emulated CUDA backend (CUDA, not on a GPU: RATEST_GPU unset), whose kernels
// run each GPU thread on the CPU (a ring catalogue at every rank count there takes minutes),
// runs fewer cases: `emulated` of them, where the CPU backend and a GPU run `full`.
bool emulated();
inline int sized(int full, int emulated_count) { return emulated() ? emulated_count : full; }

// A head dimension the backend's kernels take (ringattn.h: CUDA wants multiples of 8 up to 256):
// d on the CPU, else d rounded up to a multiple of 8.
int backend_dim(int d);

// While one lives, test_backend() is `b` in every thread (a CUDA test running the same case on
// the CPU backend, in host memory, to compare). Not nested across threads.
class ScopedBackend {
  public:
    explicit ScopedBackend(ringattn_backend_t b);
    ~ScopedBackend();
    ScopedBackend(const ScopedBackend &) = delete;
    ScopedBackend &operator=(const ScopedBackend &) = delete;

  private:
    int previous_;
};

// Device memory of the backend under test; is_host(): the tests' host memory is the device's.
class DeviceMemory {
  public:
    virtual ~DeviceMemory() = default;
    virtual bool is_host() const = 0;
    virtual void *alloc(size_t bytes) = 0;
    virtual void release(void *p) = 0;
    // With stream (nullptr: the device's): the copy is ordered on it and waited for; without,
    // download waits for every stream of the device first.
    virtual void upload(void *dev, const void *host, size_t bytes, void *stream = nullptr) = 0;
    virtual void download(void *host, const void *dev, size_t bytes, void *stream = nullptr) = 0;
    // A stream of the device for one rank's calls (nullptr on a host backend), and its end.
    virtual void *stream_create() = 0;
    virtual void stream_destroy(void *stream) = 0;
};

DeviceMemory &device_memory(); // of test_backend()

// P comms of the threads transport of the backend under test's memory (host, or device: the
// device-copy transport).
ringattn_status_t make_thread_comms(int ranks, ringattn_comm_t *comms);

// Under the emulated CUDA backend: how later launches schedule threads and drain streams
// (0 round robin / in order, 1 random with the seed, 2 highest first / reverse), so that a case
// run under two schedules must give the same bits. False (nothing changed) elsewhere.
bool set_schedule(int kind, unsigned long long seed = 0);

// The backend's copy of a host range: the host range itself on a host backend.
class Mirror {
  public:
    Mirror() = default;
    Mirror(const Mirror &) {} // a copy mirrors nothing until bound
    Mirror &operator=(const Mirror &) { return *this; }
    ~Mirror();
    // The copy of [host, host + bytes), written from it now (ordered on stream, if one: a rank
    // of ranks as threads must not wait for its peers' streams).
    void *bind(void *host, size_t bytes, void *stream = nullptr);
    // The copy's bytes back into the host range bound last.
    void download(void *stream = nullptr);

  private:
    DeviceMemory *mem_ = nullptr; // of the backend at the first bind
    void *host_ = nullptr, *dev_ = nullptr;
    size_t bytes_ = 0, capacity_ = 0;
};

// A host vector with its mirror (LSE, bias, dBias arrays).
template <class T>
struct Mirrored {
    std::vector<T> host;
    Mirror dev;
    T *bind(void *stream = nullptr)
    {
        return static_cast<T *>(dev.bind(host.data(), host.size() * sizeof(T), stream));
    }
};

} // namespace ratest
