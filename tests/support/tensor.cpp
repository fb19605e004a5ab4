#include "support/tensor.hpp"

#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace ratest {

size_t dtype_size(ringattn_dtype_t dt) { return dt == RINGATTN_FLOAT32 ? 4 : 2; }

const char *dtype_name(ringattn_dtype_t dt)
{
    switch (dt) {
    case RINGATTN_FLOAT32: return "float32";
    case RINGATTN_FLOAT16: return "float16";
    case RINGATTN_BFLOAT16: return "bfloat16";
    }
    return "?";
}

double round_to_dtype(double x, ringattn_dtype_t dt)
{
    float f = (float)x;
    switch (dt) {
    case RINGATTN_FLOAT32: return f;
    case RINGATTN_FLOAT16: return round_to_half(f);
    case RINGATTN_BFLOAT16: return round_to_bf16(f);
    }
    throw std::logic_error("bad dtype");
}

Buffer::Buffer(ringattn_dtype_t dt, size_t n) : dtype(dt), bytes(n * dtype_size(dt)), elems(n)
{
    fill_nan();
}

void Buffer::fill_nan()
{
    for (size_t i = 0; i < elems; ++i) {
        if (dtype == RINGATTN_FLOAT32) {
            float f = NAN;
            std::memcpy(bytes.data() + 4 * i, &f, 4);
        } else {
            uint16_t h = dtype == RINGATTN_FLOAT16 ? 0x7e00 : 0x7fc0;
            std::memcpy(bytes.data() + 2 * i, &h, 2);
        }
    }
}

double TView::get(int64_t t, int h, int c) const
{
    const unsigned char *p = buf->bytes.data() + (size_t)index(t, h, c) * dtype_size(buf->dtype);
    if (buf->dtype == RINGATTN_FLOAT32) {
        float f;
        std::memcpy(&f, p, 4);
        return f;
    }
    uint16_t b;
    std::memcpy(&b, p, 2);
    return buf->dtype == RINGATTN_FLOAT16 ? half_bits_to_float(b) : bf16_bits_to_float(b);
}

uint64_t TView::bits(int64_t t, int h, int c) const
{
    const unsigned char *p = buf->bytes.data() + (size_t)index(t, h, c) * dtype_size(buf->dtype);
    uint64_t b = 0;
    std::memcpy(&b, p, dtype_size(buf->dtype));
    return b;
}

void TView::set(int64_t t, int h, int c, double x)
{
    unsigned char *p = buf->bytes.data() + (size_t)index(t, h, c) * dtype_size(buf->dtype);
    float f = (float)x;
    if (buf->dtype == RINGATTN_FLOAT32) {
        std::memcpy(p, &f, 4);
        return;
    }
    uint16_t b = buf->dtype == RINGATTN_FLOAT16 ? float_to_half_bits(f) : float_to_bf16_bits(f);
    std::memcpy(p, &b, 2);
}

void TView::set_nan(int64_t t, int h, int c) { set(t, h, c, NAN); }

void TView::poison()
{
    for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h)
            for (int c = 0; c < dim; ++c) set_nan(t, h, c);
}

ringattn_tensor_t TView::host_desc() const
{
    ringattn_tensor_t d;
    d.data = buf ? buf->ptr(off) : nullptr;
    d.row_stride = zero_strides ? 0 : rs;
    d.head_stride = zero_strides ? 0 : hs;
    return d;
}

ringattn_tensor_t TView::desc() const
{
    ringattn_tensor_t d = host_desc();
    d.data = buf ? buf->device(off) : nullptr;
    return d;
}

Dense TView::to_dense() const
{
    Dense d(T, heads, dim);
    for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h)
            for (int c = 0; c < dim; ++c) d.at(t, h, c) = get(t, h, c);
    return d;
}

void TView::from_dense(const Dense &d)
{
    for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h)
            for (int c = 0; c < dim; ++c) set(t, h, c, d.at(t, h, c));
}

bool TView::any_nonfinite() const
{
    for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h)
            for (int c = 0; c < dim; ++c)
                if (!std::isfinite(get(t, h, c))) return true;
    return false;
}

TView make_packed(ringattn_dtype_t dt, int64_t T, int heads, int dim, bool zero_strides)
{
    TView v;
    size_t n = (size_t)(T * heads * dim);
    v.buf = std::make_shared<Buffer>(dt, n > 0 ? n : 1);
    v.T = T;
    v.heads = heads;
    v.dim = dim;
    v.hs = dim;
    v.rs = (int64_t)heads * dim;
    v.zero_strides = zero_strides;
    return v;
}

TView make_padded(ringattn_dtype_t dt, int64_t T, int heads, int dim, int head_pad, int row_pad)
{
    TView v;
    v.T = T;
    v.heads = heads;
    v.dim = dim;
    v.hs = dim + head_pad;
    v.rs = (int64_t)heads * v.hs + row_pad;
    size_t n = (size_t)(T * v.rs);
    v.buf = std::make_shared<Buffer>(dt, n > 0 ? n : 1);
    return v;
}

void make_interleaved(ringattn_dtype_t dt, int64_t T, int ha, int da, int hb, int db, int hc,
                      int dc, int row_pad, TView &a, TView &b, TView &c)
{
    int64_t rs = (int64_t)ha * da + (int64_t)hb * db + (int64_t)hc * dc + row_pad;
    size_t n = (size_t)(T * rs);
    auto buf = std::make_shared<Buffer>(dt, n > 0 ? n : 1);
    auto mk = [&](TView &v, int64_t off, int h, int d) {
        v = TView();
        v.buf = buf;
        v.off = off;
        v.T = T;
        v.heads = h;
        v.dim = d;
        v.hs = d;
        v.rs = rs;
    };
    mk(a, 0, ha, da);
    mk(b, (int64_t)ha * da, hb, db);
    mk(c, (int64_t)ha * da + (int64_t)hb * db, hc, dc);
}

std::vector<unsigned char> snapshot(const TView &v) { return v.buf->bytes; }

bool padding_unchanged(const std::vector<unsigned char> &before,
                       const std::vector<const TView *> &views)
{
    if (views.empty()) return true;
    const Buffer &b = *views[0]->buf;
    const size_t es = dtype_size(b.dtype);
    std::vector<char> covered(b.elems, 0);
    for (const TView *v : views)
        for (int64_t t = 0; t < v->T; ++t)
            for (int h = 0; h < v->heads; ++h)
                for (int c = 0; c < v->dim; ++c) covered[(size_t)v->index(t, h, c)] = 1;
    for (size_t i = 0; i < b.elems; ++i)
        if (!covered[i] && std::memcmp(&before[i * es], &b.bytes[i * es], es) != 0) return false;
    return true;
}

void fill_normal(TView &v, std::mt19937_64 &rng, double sigma)
{
    std::normal_distribution<double> nd(0.0, sigma);
    for (int64_t t = 0; t < v.T; ++t)
        for (int h = 0; h < v.heads; ++h)
            for (int c = 0; c < v.dim; ++c) v.set(t, h, c, nd(rng));
}

uint64_t seed_for(const char *name, uint64_t index)
{
    static const char *salt = std::getenv("RATEST_SEED");
    uint64_t h = 1469598103934665603ull; // FNV-1a
    for (const char *p = salt ? salt : ""; *p; ++p) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    for (const char *p = name; *p; ++p) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h ^= index + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

} // namespace ratest
