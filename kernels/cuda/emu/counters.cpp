// The SIMT emulation's performance counters (counters.h).
#include "kernels/cuda/emu/counters.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cuda/emu/emu_internal.h"

namespace ra_emu {

namespace {

bool counting_from_env()
{
    const char *on = std::getenv("RA_EMU_COUNTERS"), *file = std::getenv("RA_EMU_COUNTERS_FILE");
    return (on && *on && std::string(on) != "0") || (file && *file);
}

std::mutex report_mu;
std::string last_report;

// One warp-wide request in progress: the lanes that made it so far.
struct Group {
    Kind kind;
    Site site;
    bool judged;
    uint8_t count;  // lanes so far
    uint32_t lanes; // which
    uintptr_t addr[32];
    uint8_t bytes[32];
};

// A lane's count of its accesses per site (hashed: two sites sharing a slot share a count,
// which every lane then counts alike, so requests still pair up).
constexpr int SLOTS = 1024;

int width_index(unsigned bytes)
{
    return bytes <= 1 ? 0 : bytes <= 2 ? 1 : bytes <= 4 ? 2 : bytes <= 8 ? 3 : 4;
}

bool is_shared(Kind k) { return k != Kind::ld_global && k != Kind::st_global; }

// Shared memory: the most distinct 4-byte words any of the 32 banks serves; global: 32-byte
// sectors touched.
uint64_t units_of(const Group &g)
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
        if (same && g.bytes[0] <= 4 && g.addr[0] % 4 + g.bytes[0] <= 4 && is_shared(g.kind)) return 1;
        if (consecutive && g.addr[0] % unit == 0 && g.bytes[0] >= 4)
            return is_shared(g.kind) ? (uint64_t)g.bytes[0] / 4 : (uint64_t)(32 * g.bytes[0]) / 32;
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
    if (!is_shared(g.kind)) return (uint64_t)n;
    int per_bank[32] = {0}, most = 1;
    for (int i = 0; i < n; ++i) most = std::max(most, ++per_bank[words[i] % 32]);
    return (uint64_t)most;
}

} // namespace

bool counting_on = counting_from_env();
bool counters_print = counting_on;

// Groups in order, grown without initialising them (a vector would zero 300 bytes a group).
struct GroupList {
    std::unique_ptr<Group[]> at;
    size_t n = 0, cap = 0;
    bool empty() const { return n == 0; }
    size_t size() const { return n; }
    Group &operator[](size_t i) { return at[i]; }
    Group &grow()
    {
        if (n == cap) {
            const size_t c = cap ? 2 * cap : 64;
            std::unique_ptr<Group[]> more(new Group[c]);
            std::memcpy(static_cast<void *>(more.get()), at.get(), n * sizeof(Group));
            at = std::move(more), cap = c;
        }
        return at[n++];
    }
    void clear() { n = 0; }
    Group *begin() { return at.get(); }
    Group *end() { return at.get() + n; }
};

// A warp's requests in progress: by site slot, the k-th access of every lane at it is group k.
struct WarpGroups {
    GroupList groups[SLOTS];
    uint32_t occurrences[32][SLOTS];
    std::vector<int> touched; // the slots in use
};

struct CounterState {
    LaunchCounters *into = nullptr;
    int nthreads = 0;
    std::vector<std::unique_ptr<WarpGroups>> warps;
};

namespace {

// Made once per worker and kept (its tables are large; a launch has many blocks).
thread_local std::unique_ptr<CounterState> worker_state;

void judge(CounterState &cs, Group &g)
{
    g.judged = true;
    unsigned widest = 1;
    uint64_t bytes = 0;
    for (int l = 0; l < 32; ++l)
        if (g.lanes >> l & 1) widest = std::max<unsigned>(widest, g.bytes[l]), bytes += g.bytes[l];
    KindCount &k = cs.into->by[(int)g.kind][width_index(widest)];
    const uint64_t units = units_of(g);
    ++k.requests;
    k.units += units;
    k.bytes += bytes;
    if (!is_shared(g.kind)) return;
    static const char *const names[KINDS] = {" ld.shared", " st.shared", "", "", " cp.async", "", ""};
    KindCount &at = cs.into->shared_sites[site_str(g.site) + names[(int)g.kind]];
    ++at.requests;
    at.units += units;
    at.bytes += bytes;
}

CounterState *state() { return block().counters; }

} // namespace

void count_access_slow(Kind kind, const void *p, unsigned bytes, Site s)
{
    Block &b = block();
    CounterState *cs = b.counters;
    if (!cs) return;
    const Thread *t = b.current;
    const int lane = t->tid % 32, w = t->tid / 32;
    WarpGroups &wg = *cs->warps[(size_t)w];
    const size_t slot =
        (std::hash<const void *>()(s.file) ^ (size_t)s.line * 31u ^ (size_t)kind) % SLOTS;
    const uint32_t occ = wg.occurrences[lane][slot]++;
    GroupList &groups = wg.groups[slot];
    if (groups.empty()) wg.touched.push_back((int)slot);
    while (occ >= groups.size()) { // the first lane here (or one ahead of the others)
        Group &fresh = groups.grow();
        fresh.kind = kind, fresh.site = s, fresh.judged = false, fresh.count = 0, fresh.lanes = 0;
    }
    Group &g = groups[occ];
    g.addr[lane] = (uintptr_t)p;
    g.bytes[lane] = (uint8_t)bytes;
    g.lanes |= 1u << lane;
    const int lanes_in_warp = std::min(32, b.nthreads - w * 32);
    if (++g.count == lanes_in_warp) judge(*cs, g);
}

void count_ffma_slow()
{
    if (CounterState *cs = state()) ++cs->into->ffma;
}

void counters_block_begin(Block &b, LaunchCounters *into)
{
    if (!counting_on) return;
    std::unique_ptr<CounterState> &cs = worker_state;
    if (!cs || cs->nthreads != b.nthreads) {
        cs.reset(new CounterState);
        cs->nthreads = b.nthreads;
        for (size_t w = 0; w < b.warps.size(); ++w) {
            cs->warps.emplace_back(new WarpGroups);
            std::memset(cs->warps.back()->occurrences, 0, sizeof cs->warps.back()->occurrences);
        }
    }
    cs->into = into;
    b.counters = cs.get();
}

void counters_flush_warp(Block &b, int warp)
{
    if (!b.counters) return;
    WarpGroups &wg = *b.counters->warps[(size_t)warp];
    for (const int slot : wg.touched) {
        for (Group &g : wg.groups[slot])
            if (!g.judged && g.lanes) judge(*b.counters, g);
        wg.groups[slot].clear();
        for (int l = 0; l < 32; ++l) wg.occurrences[l][slot] = 0;
    }
    wg.touched.clear();
}

void counters_flush_block(Block &b)
{
    for (int w = 0; b.counters && w < (int)b.warps.size(); ++w) counters_flush_warp(b, w);
}

void counters_block_end(Block &b)
{
    counters_flush_block(b);
    b.counters = nullptr;
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
        Group g{Kind::ld_shared, Site{}, false, 0, 0, {}, {}};
        for (int r = 0; r < 8; ++r) g.addr[r] = addr[8 * m + r], g.bytes[r] = 16, g.lanes |= 1u << r;
        k.units += units_of(g);
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

void LaunchCounters::add(const LaunchCounters &o)
{
    for (int k = 0; k < KINDS; ++k)
        for (int w = 0; w < WIDTHS; ++w) {
            by[k][w].requests += o.by[k][w].requests;
            by[k][w].units += o.by[k][w].units;
            by[k][w].bytes += o.by[k][w].bytes;
        }
    mma_issued += o.mma_issued, mma_useful += o.mma_useful, ffma += o.ffma;
    barriers += o.barriers, shuffles += o.shuffles;
    max_cp_async_groups = std::max(max_cp_async_groups, o.max_cp_async_groups);
    for (const auto &s : o.shared_sites) {
        KindCount &k = shared_sites[s.first];
        k.requests += s.second.requests, k.units += s.second.units, k.bytes += s.second.bytes;
    }
}

std::string LaunchCounters::json() const
{
    static const char *const kind_names[KINDS] = {"ld.shared", "st.shared", "ld.global", "st.global",
                                                  "cp.async", "ldmatrix.x4", "ldmatrix.x4.trans"};
    static const char *const widths[WIDTHS] = {".b8", ".b16", ".b32", ".b64", ".b128"};
    uint64_t sreq = 0, swf = 0, sread = 0, swritten = 0, greq = 0, gsec = 0, gbytes = 0;
    std::string kinds;
    for (int k = 0; k < KINDS; ++k)
        for (int w = 0; w < WIDTHS; ++w) {
            const KindCount &c = by[k][w];
            if (!c.requests) continue;
            const Kind kind = (Kind)k;
            if (is_shared(kind)) {
                sreq += c.requests, swf += c.units;
                (kind == Kind::st_shared || kind == Kind::cp_async ? swritten : sread) += c.bytes;
            } else {
                greq += c.requests, gsec += c.units, gbytes += c.bytes;
            }
            const bool ldsm = kind == Kind::ldmatrix || kind == Kind::ldmatrix_trans;
            char one[192];
            std::snprintf(one, sizeof one, "%s\"%s%s\":{\"requests\":%llu,\"%s\":%llu,\"bytes\":%llu}",
                          kinds.empty() ? "" : ",", kind_names[k], ldsm ? "" : widths[w],
                          (unsigned long long)c.requests, is_shared(kind) ? "wavefronts" : "sectors",
                          (unsigned long long)c.units, (unsigned long long)c.bytes);
            kinds += one;
        }
    std::string name;
    for (const char *c = kernel.c_str(); *c; ++c) {
        if (*c == '"' || *c == '\\') name += '\\';
        name += *c;
    }
    char head[1024];
    std::snprintf(head, sizeof head,
                  "{\"kernel\":\"%s\",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"smem\":%zu,"
                  "\"smem_requests\":%llu,\"smem_wavefronts\":%llu,\"smem_bytes_read\":%llu,"
                  "\"smem_bytes_written\":%llu,\"gmem_requests\":%llu,\"gmem_sectors\":%llu,"
                  "\"gmem_bytes\":%llu,\"mma_issued\":%llu,\"mma_useful\":%llu,\"flops\":%llu,"
                  "\"useful_flops\":%llu,\"ffma\":%llu,\"barriers\":%llu,\"shuffles\":%llu,"
                  "\"max_cp_async_groups\":%d,\"by_kind\":{",
                  name.c_str(), grid.x, grid.y, grid.z, block.x, block.y, block.z, smem,
                  (unsigned long long)sreq, (unsigned long long)swf, (unsigned long long)sread,
                  (unsigned long long)swritten, (unsigned long long)greq, (unsigned long long)gsec,
                  (unsigned long long)gbytes, (unsigned long long)mma_issued,
                  (unsigned long long)mma_useful, (unsigned long long)(mma_issued * 4096 + ffma * 2),
                  (unsigned long long)(mma_useful * 4096 + ffma * 2), (unsigned long long)ffma,
                  (unsigned long long)barriers, (unsigned long long)shuffles, max_cp_async_groups);
    std::vector<std::pair<std::string, KindCount>> sites(shared_sites.begin(), shared_sites.end());
    std::sort(sites.begin(), sites.end(), [](const auto &a, const auto &b) {
        return a.second.units != b.second.units ? a.second.units > b.second.units : a.first < b.first;
    });
    std::string worst;
    for (size_t i = 0; i < sites.size() && i < 8; ++i) {
        char one[256];
        std::snprintf(one, sizeof one, "%s\"%s\":{\"requests\":%llu,\"wavefronts\":%llu}",
                      i ? "," : "", sites[i].first.c_str(),
                      (unsigned long long)sites[i].second.requests,
                      (unsigned long long)sites[i].second.units);
        worst += one;
    }
    return std::string(head) + kinds + "},\"smem_sites\":{" + worst + "}}";
}

void counters_report(const LaunchCounters &c)
{
    const std::string line = c.json();
    std::lock_guard<std::mutex> lk(report_mu);
    last_report = line;
    if (!counters_print) return;
    const char *file = std::getenv("RA_EMU_COUNTERS_FILE");
    FILE *f = file && *file ? std::fopen(file, "a") : stderr;
    if (!f) return;
    std::fprintf(f, "%s\n", line.c_str());
    if (f != stderr) std::fclose(f);
}

std::string counters_last()
{
    std::lock_guard<std::mutex> lk(report_mu);
    return last_report;
}

} // namespace ra_emu
