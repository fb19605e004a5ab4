// The counters' report (counters.h): a launch's counts summed over its workers, as one JSON
// line.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

#include "emu/counters.h"

namespace ra_emu {

namespace {

std::mutex report_mu;
std::string last_report;

} // namespace

void LaunchCounters::add(const LaunchCounters &o)
{
    for (int k = 0; k < KINDS; ++k)
        for (int w = 0; w < WIDTHS; ++w) by[k][w].add(o.by[k][w]);
    mma_issued += o.mma_issued, mma_useful += o.mma_useful, ffma += o.ffma;
    barriers += o.barriers, shuffles += o.shuffles;
    max_cp_async_groups = std::max(max_cp_async_groups, o.max_cp_async_groups);
    for (const auto &s : o.shared_sites) shared_sites[s.first].add(s.second);
}

std::string LaunchCounters::json() const
{
    static const char *const kind_names[KINDS] = {"ld.shared", "st.shared", "ld.global", "st.global",
                                                  "cp.async", "ldmatrix.x4", "ldmatrix.x4.trans"};
    static const char *const widths[WIDTHS] = {".b8", ".b16", ".b32", ".b64", ".b128"};
    uint64_t sreq = 0, swf = 0, sideal = 0, sread = 0, swritten = 0, greq = 0, gsec = 0, gbytes = 0;
    std::string kinds;
    for (int k = 0; k < KINDS; ++k)
        for (int w = 0; w < WIDTHS; ++w) {
            const KindCount &c = by[k][w];
            if (!c.requests) continue;
            const Kind kind = (Kind)k;
            if (is_shared(kind)) {
                sreq += c.requests, swf += c.units, sideal += c.ideal;
                (kind == Kind::st_shared || kind == Kind::cp_async ? swritten : sread) += c.bytes;
            } else {
                greq += c.requests, gsec += c.units, gbytes += c.bytes;
            }
            const bool ldsm = kind == Kind::ldmatrix || kind == Kind::ldmatrix_trans;
            char one[256], ideal[64] = "";
            if (is_shared(kind))
                std::snprintf(ideal, sizeof ideal, ",\"ideal\":%llu", (unsigned long long)c.ideal);
            std::snprintf(one, sizeof one, "%s\"%s%s\":{\"requests\":%llu,\"%s\":%llu%s,\"bytes\":%llu}",
                          kinds.empty() ? "" : ",", kind_names[k], ldsm ? "" : widths[w],
                          (unsigned long long)c.requests, is_shared(kind) ? "wavefronts" : "sectors",
                          (unsigned long long)c.units, ideal, (unsigned long long)c.bytes);
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
                  "\"smem_requests\":%llu,\"smem_wavefronts\":%llu,\"smem_ideal_wavefronts\":%llu,"
                  "\"smem_bytes_read\":%llu,"
                  "\"smem_bytes_written\":%llu,\"gmem_requests\":%llu,\"gmem_sectors\":%llu,"
                  "\"gmem_bytes\":%llu,\"mma_issued\":%llu,\"mma_useful\":%llu,\"flops\":%llu,"
                  "\"useful_flops\":%llu,\"ffma\":%llu,\"barriers\":%llu,\"shuffles\":%llu,"
                  "\"max_cp_async_groups\":%d,\"by_kind\":{",
                  name.c_str(), grid.x, grid.y, grid.z, block.x, block.y, block.z, smem,
                  (unsigned long long)sreq, (unsigned long long)swf, (unsigned long long)sideal,
                  (unsigned long long)sread,
                  (unsigned long long)swritten, (unsigned long long)greq, (unsigned long long)gsec,
                  (unsigned long long)gbytes, (unsigned long long)mma_issued,
                  (unsigned long long)mma_useful, (unsigned long long)(mma_issued * 4096 + ffma * 2),
                  (unsigned long long)(mma_useful * 4096 + ffma * 2), (unsigned long long)ffma,
                  (unsigned long long)barriers, (unsigned long long)shuffles, max_cp_async_groups);
    std::vector<std::pair<std::string, KindCount>> sites(shared_sites.begin(), shared_sites.end());
    std::sort(sites.begin(), sites.end(), [](const auto &a, const auto &b) {
        const uint64_t ea = a.second.units - a.second.ideal, eb = b.second.units - b.second.ideal;
        if (ea != eb) return ea > eb; // the conflicts first
        return a.second.units != b.second.units ? a.second.units > b.second.units : a.first < b.first;
    });
    std::string worst;
    for (size_t i = 0; i < sites.size() && i < 8; ++i) {
        char one[256];
        std::snprintf(one, sizeof one, "%s\"%s\":{\"requests\":%llu,\"wavefronts\":%llu,\"ideal\":%llu}",
                      i ? "," : "", sites[i].first.c_str(),
                      (unsigned long long)sites[i].second.requests,
                      (unsigned long long)sites[i].second.units,
                      (unsigned long long)sites[i].second.ideal);
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
