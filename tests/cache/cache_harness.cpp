#include "cache/cache_harness.hpp"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/dtype.h"
#include "support/device.hpp"
#include "support/shim.hpp"

namespace cachetest {

using ratest::Problem;
using ratest::TView;

namespace {

// Rows of a global packed tensor (indices idx) in a buffer of idx.size() + extra rows, the extra
// ones poisoned (NaN in every dtype), with its mirror for the backend under test.
struct Rows {
    std::vector<unsigned char> bytes;
    ratest::Mirror dev;
    Rows(const TView &g, const std::vector<int64_t> &idx, size_t extra)
    {
        const size_t elem = ratest::dtype_size(g.buf->dtype), width = (size_t)g.heads * g.dim;
        bytes.assign((idx.size() + extra) * width * elem + elem, 0xff);
        for (size_t r = 0; r < idx.size(); ++r)
            std::memcpy(bytes.data() + r * width * elem,
                        g.buf->bytes.data() + ((size_t)g.off + (size_t)idx[r] * width) * elem,
                        width * elem);
    }
    void *device() { return dev.bind(bytes.data(), bytes.size()); }
};

std::vector<float> to_float(const std::vector<unsigned char> &b, ringattn_dtype_t dt, size_t n)
{
    std::vector<float> f(n);
    ra__load_f32(f.data(), b.data(), dt, (int64_t)n);
    return f;
}

// Where each cached key (packed by cu_cache) and each new key (by cu_new) sits among the
// problem's keys (by cfg.cu_k: a sequence's cached keys, then its new ones).
struct KeyMap {
    std::vector<int64_t> cached, fresh;
    KeyMap(const ratest::AttnConfig &c, const std::vector<int32_t> &cu_cache,
           const std::vector<int32_t> &cu_new)
    {
        const std::vector<int32_t> &ck = c.cuk();
        for (int s = 0; s < c.num_seqs(); ++s) {
            const int32_t lc = cu_cache[(size_t)s + 1] - cu_cache[(size_t)s];
            for (int32_t j = 0; j < lc; ++j) cached.push_back(ck[(size_t)s] + j);
            const int32_t ln = cu_new.empty() ? 0 : cu_new[(size_t)s + 1] - cu_new[(size_t)s];
            for (int32_t j = 0; j < ln; ++j) fresh.push_back(ck[(size_t)s] + lc + j);
        }
    }
};

void rank_work(const Problem &pb, const CacheLayout &l, ringattn_comm_t comm, int rank,
               ringattn_layout_t layout, const CacheOptions &opt, CacheResult &res,
               std::mutex &mu)
{
    const ratest::AttnConfig &c = pb.cfg;
    const std::vector<int32_t> cu_cache = cached_keys(c, l);
    ringattn_plan_desc_t d = ratest::make_desc(c);
    d.layout = layout;
    d.cu_seqlens_k = cu_cache.data();
    d.sharded_cache = 1;
    d.cache_bounds = l.bounds.empty() ? nullptr : l.bounds.data();
    d.cu_seqlens_new = l.cu_new.empty() ? nullptr : l.cu_new.data();
    d.ulysses_size = opt.ulysses;
    if (opt.ring.desc_hook) opt.ring.desc_hook(rank, d);
    auto fail = [&](ringattn_status_t st, const std::string &why) {
        std::lock_guard<std::mutex> lk(mu);
        if (res.status == RINGATTN_SUCCESS) res.status = st;
        res.rank_status[(size_t)rank] = st;
        res.message[(size_t)rank] = why;
    };
    ringattn_plan_t plan = nullptr;
    ringattn_status_t st = ringattn_plan_create(comm, &d, &plan);
    if (st != RINGATTN_SUCCESS) return fail(st, ringattn_last_error());
    int64_t nk = 0;
    ringattn_plan_local_keys(plan, &nk, nullptr);
    std::vector<int32_t> kidx((size_t)nk);
    ringattn_plan_local_keys(plan, &nk, kidx.data());
    const KeyMap map(c, cu_cache, l.cu_new);
    std::vector<int64_t> keys, queries((size_t)c.Tq());
    for (int32_t i : kidx) keys.push_back(map.cached[(size_t)i]);
    for (size_t i = 0; i < queries.size(); ++i) queries[i] = (int64_t)i;
    Rows q(pb.q, queries, 0), k(pb.k, keys, (size_t)l.unfilled), v(pb.v, keys, (size_t)l.unfilled);
    Rows kn(pb.k, map.fresh, 1), vn(pb.v, map.fresh, 1);
    if (opt.edit_q) opt.edit_q(rank, q.bytes);
    const int H = c.H, Hb = c.key_bias_heads;
    const size_t e = ratest::dtype_size(c.dtype), Tq = (size_t)c.Tq();
    std::vector<unsigned char> o_bytes(Tq * H * c.dv() * e + e, 0xff); // NaN: SPEC 10 case 7
    ratest::Mirror o_dev;
    ratest::Mirrored<float> lse, bias, bias_new, sinks;
    sinks.host = pb.sinks_buf; // SPEC 11: the same on every rank, added once at the merge
    lse.host.assign((size_t)H * Tq + 1, NAN);
    bias.host.assign((size_t)Hb * keys.size() + 1, NAN);
    bias_new.host.assign((size_t)Hb * map.fresh.size() + 1, NAN);
    const int64_t Tk = c.Tk();
    for (int hb = 0; hb < Hb; ++hb) {
        for (size_t r = 0; r < keys.size(); ++r)
            bias.host[(size_t)hb * keys.size() + r] = pb.bias_buf[(size_t)(hb * Tk + keys[r])];
        for (size_t r = 0; r < map.fresh.size(); ++r)
            bias_new.host[(size_t)hb * map.fresh.size() + r] =
                pb.bias_buf[(size_t)(hb * Tk + map.fresh[r])];
    }
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    t.q.data = q.device();
    t.k.data = k.device();
    t.v.data = v.device();
    t.k_new.data = kn.device();
    t.v_new.data = vn.device();
    t.o.data = o_dev.bind(o_bytes.data(), o_bytes.size());
    t.lse = lse.bind();
    t.key_bias = Hb > 0 ? bias.bind() : nullptr;
    t.key_bias_new = Hb > 0 ? bias_new.bind() : nullptr;
    t.sinks = sinks.host.empty() ? nullptr : sinks.bind();
    if (opt.ulysses > 1) { // this rank's kv heads (and bias heads) of the group's slots
        const int pu = opt.ulysses, m = rank % pu, Hk = c.hkv(), hq = H / pu;
        const auto first = [&](int heads) { return m * hq * heads / H; };
        const int fk = first(Hk), fb = Hb ? first(Hb) : 0;
        const size_t D = (size_t)c.D, Dv = (size_t)c.dv();
        t.k = {(char *)t.k.data + (size_t)fk * D * e, (int64_t)(Hk * D), (int64_t)D};
        t.v = {(char *)t.v.data + (size_t)fk * Dv * e, (int64_t)(Hk * Dv), (int64_t)Dv};
        t.k_new = {(char *)t.k_new.data + (size_t)fk * D * e, (int64_t)(Hk * D), (int64_t)D};
        t.v_new = {(char *)t.v_new.data + (size_t)fk * Dv * e, (int64_t)(Hk * Dv), (int64_t)Dv};
        if (Hb) {
            t.key_bias += (size_t)fb * keys.size();
            t.key_bias_new += (size_t)fb * map.fresh.size();
        }
    }
    ratest::DeviceMemory &mem = ratest::device_memory();
    void *stream = mem.stream_create();
    st = ringattn_forward(plan, &t, stream);
    const std::string why = st != RINGATTN_SUCCESS ? ringattn_last_error() : "";
    ringattn_plan_info_t info = RINGATTN_PLAN_INFO_INIT;
    ringattn_plan_get_info(plan, &info);
    ringattn_plan_destroy(plan);
    if (st == RINGATTN_SUCCESS) {
        o_dev.download();
        lse.dev.download();
    }
    if (stream) mem.stream_destroy(stream);
    if (st != RINGATTN_SUCCESS) return fail(st, why);
    std::lock_guard<std::mutex> lk(mu);
    res.o[(size_t)rank] = to_float(o_bytes, c.dtype, Tq * H * c.dv());
    res.lse[(size_t)rank].assign(lse.host.begin(), lse.host.end() - 1);
    res.info[(size_t)rank] = info;
}

} // namespace

std::vector<int32_t> cached_keys(const ratest::AttnConfig &c, const CacheLayout &l)
{
    std::vector<int32_t> cu{0};
    const std::vector<int32_t> &ck = c.cuk();
    for (int s = 0; s < c.num_seqs(); ++s) {
        const int32_t ln = l.cu_new.empty() ? 0 : l.cu_new[(size_t)s + 1] - l.cu_new[(size_t)s];
        cu.push_back(cu.back() + ck[(size_t)s + 1] - ck[(size_t)s] - ln);
    }
    return cu;
}

ratest::Got CacheResult::got(const ratest::AttnConfig &c, int rank) const
{
    ratest::Got g;
    g.O = ratest::Dense(c.Tq(), c.H, c.dv());
    for (size_t i = 0; i < g.O.v.size(); ++i) g.O.v[i] = o[(size_t)rank][i];
    g.lse.assign(lse[(size_t)rank].begin(), lse[(size_t)rank].end());
    return g;
}

static CacheResult blank(int n)
{
    CacheResult res;
    res.rank_status.assign((size_t)n, RINGATTN_SUCCESS);
    res.message.resize((size_t)n);
    res.o.resize((size_t)n);
    res.lse.resize((size_t)n);
    res.info.assign((size_t)n, ringattn_plan_info_t RINGATTN_PLAN_INFO_INIT);
    return res;
}

CacheResult run_cache_rank(const Problem &pb, const CacheLayout &l, ringattn_comm_t comm,
                           int rank, ringattn_layout_t layout, const CacheOptions &opt)
{
    CacheResult res = blank(rank + 1);
    std::mutex mu;
    rank_work(pb, l, comm, rank, layout, opt, res, mu);
    return res;
}

CacheResult run_cache(const Problem &pb, const CacheLayout &l, int ranks,
                      ringattn_layout_t layout, const CacheOptions &opt)
{
    CacheResult res = blank(ranks > 0 ? ranks : 1);
    std::mutex mu;
    if (ranks == 0) {
        rank_work(pb, l, nullptr, 0, layout, opt, res, mu);
        return res;
    }
    std::vector<ringattn_comm_t> comms((size_t)ranks, nullptr);
    std::function<ringattn_status_t(int, int, ringattn_comm_t *)> make = opt.ring.make_comm;
    unsigned char id[128];
    if (opt.ring.nccl) {
        const ringtest::NcclEntry nccl = ringtest::nccl_entry();
        if (!nccl) {
            res.status = RINGATTN_ERR_UNSUPPORTED;
            return res;
        }
        REQUIRE(nccl.get_id(id) == 0);
        make = [&, nccl](int r, int size, ringattn_comm_t *comm) {
            return nccl.create(id, size, r, -1, comm);
        };
    } else if (!make) {
        res.status = ringtest::make_thread_comms(ranks, comms.data());
        if (res.status != RINGATTN_SUCCESS) return res;
    }
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] {
            ringattn_comm_t comm = comms[(size_t)r];
            if (make) {
                const ringattn_status_t st = make(r, ranks, &comm);
                if (st != RINGATTN_SUCCESS) {
                    std::lock_guard<std::mutex> lk(mu);
                    res.status = res.rank_status[(size_t)r] = st;
                    return;
                }
            }
            rank_work(pb, l, comm, r, layout, opt, res, mu);
            if (make) ringattn_comm_destroy(comm);
        });
    for (auto &th : threads) th.join();
    if (!make)
        for (auto comm : comms) ringattn_comm_destroy(comm);
    return res;
}

} // namespace cachetest
