// The SIMT emulation's performance counters (counters.h): the counting; the report is
// counters_report.cpp.
#include "emu/counters.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>

#include "emu/emu_internal.h"

namespace ra_emu {

namespace {

bool counting_from_env()
{
    const char *on = std::getenv("RA_EMU_COUNTERS"), *file = std::getenv("RA_EMU_COUNTERS_FILE");
    return (on && *on && std::string(on) != "0") || (file && *file);
}

// One warp-wide request: the lanes that made it, their addresses and widths.
struct Group {
    Kind kind;
    uint32_t lanes;
    uintptr_t addr[32];
    uint8_t bytes[32];
};

// A warp's sites in progress: an open-addressed table (a power of two, far above the sites of
// any kernel between two barriers).
constexpr int SLOTS = 1024;

int width_index(unsigned bytes)
{
    return bytes <= 1 ? 0 : bytes <= 2 ? 1 : bytes <= 4 ? 2 : bytes <= 8 ? 3 : 4;
}

// A request's units (shared memory: the most distinct 4-byte words any of the 32 banks serves;
// global: 32-byte sectors touched) and, for shared memory, its ideal: the wavefronts its
// distinct words need at 32 a wavefront (Nsight Compute's ideal; units above it are conflicts).
struct Units {
    uint64_t units, ideal;
};

Units units_of(const Group &g)
{
    // the common requests first: one word for every lane (a broadcast), or lane l at the l-th
    // consecutive element (4 bytes: 1 wavefront; 8 or 16: 2 or 4; global: its sectors)
    if (g.lanes == 0xffffffffu) {
        bool same = true, consecutive = true;
        for (int l = 1; l < 32 && (same || consecutive); ++l) {
            same = same && g.addr[l] == g.addr[0] && g.bytes[l] == g.bytes[0];
            consecutive = consecutive && g.bytes[l] == g.bytes[0] &&
                          g.addr[l] == g.addr[0] + (uintptr_t)l * g.bytes[0];
        }
        const uintptr_t unit = is_shared(g.kind) ? 4 : 32;
        if (same && g.bytes[0] <= 4 && g.addr[0] % 4 + g.bytes[0] <= 4 && is_shared(g.kind))
            return {1, 1};
        if (consecutive && g.addr[0] % unit == 0 && g.bytes[0] >= 4) {
            const uint64_t n = is_shared(g.kind) ? (uint64_t)g.bytes[0] / 4 : (uint64_t)g.bytes[0];
            return {n, n};
        }
    }
    uintptr_t words[32 * 5];
    int n = 0;
    const uintptr_t unit = is_shared(g.kind) ? 4 : 32;
    for (int l = 0; l < 32; ++l) {
        if (!(g.lanes >> l & 1)) continue;
        const uintptr_t a = g.addr[l];
        for (uintptr_t w = a / unit; w <= (a + g.bytes[l] - 1) / unit && n < 32 * 5; ++w) words[n++] = w;
    }
    std::sort(words, words + n);
    n = (int)(std::unique(words, words + n) - words);
    if (!is_shared(g.kind)) return {(uint64_t)n, (uint64_t)n};
    int per_bank[32] = {0}, most = 1;
    for (int i = 0; i < n; ++i) most = std::max(most, ++per_bank[words[i] % 32]);
    return {(uint64_t)most, (uint64_t)std::max(1, (n + 31) / 32)};
}

} // namespace

bool counting_on = counting_from_env();
bool counters_print = counting_on;

// One lane's accesses at one site that step by one stride: base, base + stride, ...
struct Run {
    uintptr_t base;
    intptr_t stride; // 0 while count is 1
    uint32_t count;
    uintptr_t at(uint32_t i) const { return base + (uintptr_t)((intptr_t)i * stride); }
};

// One site's accesses since the warp's last flush, lane by lane: the k-th access of every lane
// is request k (lanes run one after another between collectives, so a lane's accesses are
// appended as runs and judged together at the flush).
struct SiteLog {
    Site site{};
    Kind kind{};
    uint8_t bytes = 0;
    bool used = false;
    std::vector<Run> lane[32];
};

struct WarpLogs {
    SiteLog slots[SLOTS];
    std::vector<int> touched; // the slots in use
};

struct CounterState {
    LaunchCounters *into = nullptr;
    int nthreads = 0;
    std::vector<std::unique_ptr<WarpLogs>> warps;
    std::vector<LaneLog> lanes; // per thread of the block
};

thread_local LaneLog *lane_log RA_EMU_FAST_TLS = nullptr;

namespace {

// Made once per worker and kept (its tables are large; a launch has many blocks).
thread_local std::unique_ptr<CounterState> worker_state;

// Moving every lane's address by the same multiple of 4 bytes maps banks to banks one to one
// (and distinct words to distinct words): the request needs as many wavefronts; by a multiple
// of 32 bytes, sectors to sectors.
bool shift_keeps_units(Kind kind, intptr_t stride)
{
    return stride % (is_shared(kind) ? 4 : 32) == 0;
}

// Every request of a site's log, into the launch's counts and the site's. Where every lane's
// run goes on for m more requests with one stride, request k stands for all m of them.
void judge(CounterState &cs, SiteLog &log)
{
    size_t run[32] = {0};
    uint32_t off[32] = {0};
    KindCount sum;
    Group g{log.kind, 0, {}, {}};
    for (int l = 0; l < 32; ++l) g.bytes[l] = log.bytes;
    for (;;) {
        g.lanes = 0;
        uint32_t m = UINT32_MAX;
        intptr_t stride = 0;
        bool one_stride = true;
        for (int l = 0; l < 32; ++l) {
            if (run[l] == log.lane[l].size()) continue;
            const Run &r = log.lane[l][run[l]];
            g.addr[l] = r.at(off[l]), g.lanes |= 1u << l;
            m = std::min(m, r.count - off[l]);
            if (g.lanes == 1u << l) stride = r.stride; // the first lane's
            one_stride = one_stride && r.stride == stride; // (m = 1 where a lane's run ends)
        }
        if (!g.lanes) break;
        const uint64_t lanes = (uint64_t)__builtin_popcount(g.lanes);
        if (!(m > 1 && one_stride && shift_keeps_units(log.kind, stride))) m = 1;
        const Units u = units_of(g);
        sum.requests += m, sum.units += m * u.units, sum.ideal += m * u.ideal;
        sum.bytes += (uint64_t)m * log.bytes * lanes;
        for (int l = 0; l < 32; ++l) {
            if (!(g.lanes >> l & 1)) continue;
            off[l] += m;
            if (off[l] == log.lane[l][run[l]].count) ++run[l], off[l] = 0;
        }
    }
    KindCount &k = cs.into->by[(int)log.kind][width_index(log.bytes)];
    k.add(sum);
    if (!is_shared(log.kind)) return;
    static const char *const names[KINDS] = {" ld.shared", " st.shared", "", "", " cp.async", "", ""};
    KindCount &at = cs.into->shared_sites[site_str(log.site) + names[(int)log.kind]];
    at.add(sum);
}

CounterState *state() { return block().counters; }

} // namespace

void count_access_slow(LaneLog &lane, Kind kind, const void *p, unsigned bytes, Site s)
{
    Block &b = block();
    CounterState *cs = b.counters;
    if (!cs) return;
    const int tid = (int)(&lane - cs->lanes.data());
    WarpLogs &wl = *cs->warps[(size_t)(tid / 32)];
    size_t slot = (std::hash<const void *>()(s.file) ^ (size_t)s.line * 31u ^
                   (size_t)kind * 7u ^ (size_t)bytes * 131u) % SLOTS;
    SiteLog *log = nullptr;
    for (int probe = 0; !log; ++probe, slot = (slot + 1) % SLOTS) {
        if (probe == SLOTS) fail_block("counters: more than 1024 access sites between two barriers");
        SiteLog &at = wl.slots[slot];
        if (!at.used) {
            at.used = true, at.site = s, at.kind = kind, at.bytes = (uint8_t)bytes;
            wl.touched.push_back((int)slot);
        } else if (at.site.line != s.line || at.site.file != s.file || at.kind != kind ||
                   at.bytes != bytes) {
            continue;
        }
        log = &at;
    }
    // the run this lane's slot continues ends here (its count into its log)
    const unsigned at = lane_run_slot(kind, s);
    LaneRun &fast = lane.runs[at];
    if (lane.live >> at & 1) *fast.owner = fast.count;
    std::vector<Run> &runs = log->lane[tid % 32];
    const uintptr_t a = (uintptr_t)p;
    if (runs.empty()) {
        runs.push_back(Run{a, 0, 1});
    } else if (runs.back().count == 1) { // the second access fixes the run's stride
        runs.back().stride = (intptr_t)(a - runs.back().base), runs.back().count = 2;
    } else if (a == runs.back().at(runs.back().count)) {
        ++runs.back().count;
    } else {
        runs.push_back(Run{a, 0, 1});
    }
    // the fast path continues this run (count_access, cuda_emu.h) until the next flush
    Run &r = runs.back();
    const bool go_on = r.count > 1;
    fast = LaneRun{lane_run_key(kind, bytes, s), s.file, r.count, go_on ? r.at(r.count) : 0,
                   r.stride, &r.count};
    lane.live = go_on ? lane.live | 1ull << at : lane.live & ~(1ull << at);
}

// The lane's runs in progress written back to their logs, and ended.
void end_lane_runs(LaneLog &lane)
{
    for (uint64_t live = lane.live; live; live &= live - 1) {
        LaneRun &r = lane.runs[__builtin_ctzll(live)];
        *r.owner = r.count;
        r.next = 0;
    }
    lane.live = 0;
}

void counters_block_begin(Block &b, LaunchCounters *into)
{
    if (!counting_on) return;
    std::unique_ptr<CounterState> &cs = worker_state;
    if (!cs || cs->nthreads != b.nthreads) {
        cs.reset(new CounterState);
        cs->nthreads = b.nthreads;
        for (size_t w = 0; w < b.warps.size(); ++w) cs->warps.emplace_back(new WarpLogs);
        cs->lanes.resize((size_t)b.nthreads);
    }
    cs->into = into;
    b.counters = cs.get();
}

void counters_flush_warp(Block &b, int warp)
{
    if (!b.counters) return;
    WarpLogs &wl = *b.counters->warps[(size_t)warp];
    if (wl.touched.empty()) return; // nothing since the last flush (mma after mma)
    for (int t = warp * 32; t < std::min(b.nthreads, warp * 32 + 32); ++t)
        end_lane_runs(b.counters->lanes[(size_t)t]);
    for (const int slot : wl.touched) {
        SiteLog &log = wl.slots[slot];
        judge(*b.counters, log);
        log.used = false;
        for (std::vector<Run> &runs : log.lane) runs.clear(); // capacity kept for the next
    }
    wl.touched.clear();
}

LaneLog *counters_lane(Block &b, int tid)
{
    return b.counters ? &b.counters->lanes[(size_t)tid] : nullptr;
}

void counters_flush_block(Block &b)
{
    for (int w = 0; b.counters && w < (int)b.warps.size(); ++w) counters_flush_warp(b, w);
}

void counters_block_end(Block &b)
{
    counters_flush_block(b);
    if (b.counters)
        for (LaneLog &lane : b.counters->lanes) b.counters->into->ffma += lane.ffma, lane.ffma = 0;
    b.counters = nullptr;
    lane_log = nullptr;
}

void count_ldmatrix(const uintptr_t addr[32], bool trans)
{
    CounterState *cs = state();
    if (!cs) return;
    // four 8x8 matrices, each 8 rows of 16 bytes: a wavefront each when its rows hit distinct banks
    KindCount &k = cs->into->by[(int)(trans ? Kind::ldmatrix_trans : Kind::ldmatrix)][4];
    ++k.requests;
    k.bytes += 512;
    for (int m = 0; m < 4; ++m) {
        Group g{Kind::ld_shared, 0, {}, {}};
        for (int r = 0; r < 8; ++r) g.addr[r] = addr[8 * m + r], g.bytes[r] = 16, g.lanes |= 1u << r;
        const Units u = units_of(g);
        k.units += u.units, k.ideal += u.ideal;
    }
}

void count_mma(bool useful)
{
    CounterState *cs = state();
    if (!cs) return;
    ++cs->into->mma_issued;
    cs->into->mma_useful += useful;
}

void count_barrier()
{
    if (CounterState *cs = state()) ++cs->into->barriers;
}

void count_shuffle()
{
    if (CounterState *cs = state()) ++cs->into->shuffles;
}

void count_cp_async_commit(int in_flight)
{
    if (CounterState *cs = state())
        cs->into->max_cp_async_groups = std::max(cs->into->max_cp_async_groups, in_flight);
}

} // namespace ra_emu
