#include "support/device.hpp"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace ratest {

ringattn_backend_t test_backend()
{
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

namespace {

class HostMemory final : public DeviceMemory {
  public:
    bool is_host() const override { return true; }
    void *alloc(size_t) override { return nullptr; }
    void release(void *) override {}
    void upload(void *, const void *, size_t) override {}
    void download(void *, const void *, size_t) override {}
};

} // namespace

DeviceMemory &device_memory()
{
    static HostMemory host;
    if (test_backend() == RINGATTN_BACKEND_CUDA)
        throw std::runtime_error("ratest: the CUDA backend's test memory is not built here");
    return host;
}

Mirror::~Mirror()
{
    if (dev_) device_memory().release(dev_);
}

void *Mirror::bind(void *host, size_t bytes)
{
    DeviceMemory &m = device_memory();
    host_ = host;
    bytes_ = bytes;
    if (m.is_host() || !host) return host;
    if (bytes > capacity_) {
        if (dev_) m.release(dev_);
        dev_ = m.alloc(bytes);
        capacity_ = bytes;
    }
    m.upload(dev_, host, bytes);
    return dev_;
}

void Mirror::download()
{
    DeviceMemory &m = device_memory();
    if (!m.is_host() && host_ && dev_) m.download(host_, dev_, bytes_);
}

} // namespace ratest
