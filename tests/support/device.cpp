#include "support/device.hpp"

#include <dlfcn.h>

#include <atomic>

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ratest {

namespace {
std::atomic<int> backend_override{-1}; // ScopedBackend's, or -1
} // namespace

ScopedBackend::ScopedBackend(ringattn_backend_t b) : previous_(backend_override.exchange((int)b)) {}
ScopedBackend::~ScopedBackend() { backend_override.store(previous_); }

ringattn_backend_t test_backend()
{
    const int forced = backend_override.load();
    if (forced >= 0) return (ringattn_backend_t)forced;
    const char *env = std::getenv("RATEST_BACKEND");
    const std::string b = env ? env : "cpu";
    if (b == "cpu") return RINGATTN_BACKEND_CPU;
    if (b == "cuda") return RINGATTN_BACKEND_CUDA;
    if (b == "auto") return RINGATTN_BACKEND_AUTO;
    throw std::invalid_argument("RATEST_BACKEND: got '" + b + "', expected cpu, cuda or auto");
}

const char *test_backend_name()
{
    switch (test_backend()) {
    case RINGATTN_BACKEND_CPU: return "cpu";
    case RINGATTN_BACKEND_CUDA: return "cuda";
    default: return "auto";
    }
}

bool library_has_backend(const char *name)
{
    const std::string info = ringattn_build_info(); // "build: backends: cpu, cuda; ..."
    const size_t from = info.find("backends: "), to = info.find(';', from);
    if (from == std::string::npos) return false;
    const std::string list = ", " + info.substr(from + 10, to - from - 10) + ",";
    return list.find(", " + std::string(name) + ",") != std::string::npos;
}

bool emulated() { return on_cuda() && !std::getenv("RATEST_GPU"); }

int backend_dim(int d) { return on_cuda() && d % 8 ? d + 8 - d % 8 : d; }

namespace {

class HostMemory final : public DeviceMemory {
  public:
    bool is_host() const override { return true; }
    void *alloc(size_t) override { return nullptr; }
    void release(void *) override {}
    void upload(void *, const void *, size_t, void *) override {}
    void download(void *, const void *, size_t, void *) override {}
    void *stream_create() override { return nullptr; }
    void stream_destroy(void *) override {}
};

// The CUDA runtime the library under test brings (the emulated build exports its fake one) or
// the tests link (the nvcc build): found by name, so one test executable serves every build.
class CudaMemory final : public DeviceMemory {
  public:
    CudaMemory()
    {
        malloc_ = reinterpret_cast<int (*)(void **, size_t)>(dlsym(RTLD_DEFAULT, "cudaMalloc"));
        free_ = reinterpret_cast<int (*)(void *)>(dlsym(RTLD_DEFAULT, "cudaFree"));
        copy_ = reinterpret_cast<int (*)(void *, const void *, size_t, int)>(
            dlsym(RTLD_DEFAULT, "cudaMemcpy"));
        copy_async_ = reinterpret_cast<int (*)(void *, const void *, size_t, int, void *)>(
            dlsym(RTLD_DEFAULT, "cudaMemcpyAsync"));
        ssync_ = reinterpret_cast<int (*)(void *)>(dlsym(RTLD_DEFAULT, "cudaStreamSynchronize"));
        sync_ = reinterpret_cast<int (*)()>(dlsym(RTLD_DEFAULT, "cudaDeviceSynchronize"));
        screate_ = reinterpret_cast<int (*)(void **)>(dlsym(RTLD_DEFAULT, "cudaStreamCreate"));
        sdestroy_ = reinterpret_cast<int (*)(void *)>(dlsym(RTLD_DEFAULT, "cudaStreamDestroy"));
        if (!malloc_ || !free_ || !copy_ || !copy_async_ || !sync_ || !ssync_ || !screate_ ||
            !sdestroy_)
            throw std::runtime_error("ratest: RATEST_BACKEND=cuda, but no CUDA runtime is loaded "
                                     "(run against the emulated or the nvcc-built library)");
    }
    bool is_host() const override { return false; }
    void *alloc(size_t bytes) override
    {
        void *p = nullptr;
        if (malloc_(&p, bytes ? bytes : 1) != 0) throw std::runtime_error("ratest: cudaMalloc failed");
        return p;
    }
    void release(void *p) override { free_(p); }
    void upload(void *dev, const void *host, size_t bytes, void *stream) override
    {
        if (!stream) return check(copy_(dev, host, bytes, 4));
        check(copy_async_(dev, host, bytes, 4, stream));
        check(ssync_(stream));
    }
    void download(void *host, const void *dev, size_t bytes, void *stream) override
    {
        // the library's calls are stream-ordered: wait for them
        if (!stream) return check(sync_()), check(copy_(host, dev, bytes, 4));
        check(copy_async_(host, dev, bytes, 4, stream));
        check(ssync_(stream));
    }

    void *stream_create() override
    {
        void *s = nullptr;
        check(screate_(&s));
        return s;
    }
    void stream_destroy(void *s) override { check(sdestroy_(s)); }

  private:
    static void check(int e)
    {
        if (e != 0) throw std::runtime_error("ratest: CUDA error " + std::to_string(e));
    }
    int (*malloc_)(void **, size_t);
    int (*free_)(void *);
    int (*copy_)(void *, const void *, size_t, int); // kind 4: cudaMemcpyDefault
    int (*copy_async_)(void *, const void *, size_t, int, void *);
    int (*sync_)();
    int (*ssync_)(void *);
    int (*screate_)(void **);
    int (*sdestroy_)(void *);
};

} // namespace

DeviceMemory &device_memory()
{
    static HostMemory host;
    if (test_backend() == RINGATTN_BACKEND_CUDA) {
        static CudaMemory cuda;
        return cuda;
    }
    return host;
}

bool set_schedule(int kind, unsigned long long seed)
{
    using hook = void (*)(int, unsigned long long);
    static const hook set = reinterpret_cast<hook>(dlsym(RTLD_DEFAULT, "ra_emu_set_schedule"));
    if (set) set(kind, seed);
    return set != nullptr;
}

Mirror::~Mirror()
{
    if (dev_) mem_->release(dev_);
}

void *Mirror::bind(void *host, size_t bytes, void *stream)
{
    if (!mem_) mem_ = &device_memory();
    DeviceMemory &m = *mem_;
    host_ = host;
    bytes_ = bytes;
    if (m.is_host() || !host) return host;
    if (bytes > capacity_) {
        if (dev_) m.release(dev_);
        dev_ = m.alloc(bytes);
        capacity_ = bytes;
    }
    m.upload(dev_, host, bytes, stream);
    return dev_;
}

void Mirror::download(void *stream)
{
    if (mem_ && !mem_->is_host() && host_ && dev_) mem_->download(host_, dev_, bytes_, stream);
}

ringattn_status_t make_thread_comms(int ranks, ringattn_comm_t *comms)
{
    // a device backend's ring moves device memory: the device-copy threads transport
    return device_memory().is_host() ? ringattn_comm_create_threads(ranks, comms)
                                     : ringattn_comm_create_threads_device(ranks, -1, comms);
}

} // namespace ratest
