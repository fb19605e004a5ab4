// Shared memory as the kernels address it in the emulation (kernels/cuda/device.cuh's
// ra_smem<T>): a pointer whose element accesses are counted as ld.shared / st.shared requests
// of their call site (counters.h). Its raw address (ra_raw) is not counted: the wrappers of
// ldmatrix and cp.async take it, and so do functions that take T *. Under nvcc ra_smem<T> is
// T * and ra_raw the identity.
#pragma once

#include <cstddef>
#include <type_traits>

#include "emu/cuda_emu.h"

namespace ra_emu {

// An index with its call site: the default arguments are evaluated where s[i] is written.
struct SiteIndex {
    ptrdiff_t v;
    Site site;
    template <class I, class = std::enable_if_t<std::is_integral<I>::value>>
    SiteIndex(I i, RA_EMU_SITE_PARAMS) : v((ptrdiff_t)i), site{ra_file_, ra_line_}
    {
    }
};

// One element of shared memory at a site: reading it is an ld.shared, writing an st.shared.
template <class T> class SharedRef {
  public:
    SharedRef(T *p, Site s) : p_(p), s_(s) {}
    operator std::remove_const_t<T>() const
    {
        count_access(Kind::ld_shared, p_, sizeof(T), s_);
        return *p_;
    }
    template <class U> const SharedRef &operator=(const U &v) const
    {
        count_access(Kind::st_shared, p_, sizeof(T), s_);
        *p_ = v;
        return *this;
    }
    const SharedRef &operator=(const SharedRef &o) const { return *this = (std::remove_const_t<T>)o; }
    template <class U> const SharedRef &operator+=(const U &v) const { return *this = (std::remove_const_t<T>)*this + v; }
    template <class U> const SharedRef &operator-=(const U &v) const { return *this = (std::remove_const_t<T>)*this - v; }
    template <class U> const SharedRef &operator*=(const U &v) const { return *this = (std::remove_const_t<T>)*this * v; }
    T *operator&() const { return p_; }

  private:
    T *p_;
    Site s_;
};

template <class T> class SharedPtr {
  public:
    SharedPtr(T *p = nullptr) : p_(p) {}
    template <class U, class = std::enable_if_t<std::is_convertible<U *, T *>::value>>
    SharedPtr(const SharedPtr<U> &o) : p_(o.get())
    {
    }
    SharedRef<T> operator[](SiteIndex i) const { return SharedRef<T>(p_ + i.v, i.site); }
    explicit operator T *() const { return p_; } // a raw address: not counted
    T *get() const { return p_; }
    template <class I, class = std::enable_if_t<std::is_integral<I>::value>>
    SharedPtr operator+(I i) const
    {
        return SharedPtr(p_ + i);
    }
    template <class I, class = std::enable_if_t<std::is_integral<I>::value>>
    SharedPtr operator-(I i) const
    {
        return SharedPtr(p_ - i);
    }

  private:
    T *p_;
};

} // namespace ra_emu

template <class T> T *ra_raw(const ra_emu::SharedPtr<T> &p) { return p.get(); }
template <class T> T *ra_raw(T *p) { return p; }
