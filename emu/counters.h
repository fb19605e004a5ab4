// Performance counters of the SIMT emulation (issue 29): per kernel launch, what Nsight Compute
// reports for the same code. A warp's lanes run one after another between its collectives, so
// each lane's accesses are logged per call site, and the k-th access of every lane at a site is
// one warp-wide request, judged at the warp's next full-mask collective, a barrier, or the
// block's end.
// Shared memory: 32 banks of 4 bytes, a request needs as many wavefronts as its most-used bank
// has distinct words (one word read by several lanes is a broadcast); global memory: 32-byte
// sectors. Off unless RA_EMU_COUNTERS=1 (a JSON line per launch on stderr) or
// RA_EMU_COUNTERS_FILE=path (appended there), or a test turns them on: then nothing is counted
// and results never change either way. Internal to the emulation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "emu/cuda_emu.h"

namespace ra_emu {

struct Block;
struct Thread;

// The kinds of request (Kind, cuda_emu.h) and their widths (bytes per lane: 1, 2, 4, 8, 16).
constexpr int KINDS = 7, WIDTHS = 5;
inline bool is_shared(Kind k) { return k != Kind::ld_global && k != Kind::st_global; }

struct KindCount {
    uint64_t requests = 0;
    uint64_t units = 0; // shared: wavefronts; global: 32-byte sectors
    uint64_t ideal = 0; // shared: the wavefronts without bank conflicts (distinct words / 32)
    uint64_t bytes = 0;
    void add(const KindCount &o) { requests += o.requests, units += o.units, ideal += o.ideal, bytes += o.bytes; }
};

// One launch's counts (summed over its blocks).
struct LaunchCounters {
    std::string kernel;
    dim3 grid, block;
    size_t smem = 0;
    KindCount by[KINDS][WIDTHS];
    // shared-memory requests by site ("backward_common.cuh:135 ld.shared"): where conflicts are
    std::map<std::string, KindCount> shared_sites;
    uint64_t mma_issued = 0, mma_useful = 0, ffma = 0, barriers = 0, shuffles = 0;
    int max_cp_async_groups = 0;
    void add(const LaunchCounters &o);
    std::string json() const; // one line, no newline; 8 sites: most conflicts, then wavefronts
};

// Where the counts of the running block go (the worker's share of the launch), and the state
// of its requests in progress: made at the block's start while counting, dropped at its end.
void counters_block_begin(Block &b, LaunchCounters *into);
void counters_block_end(Block &b);
// The warp's requests in progress judged with the lanes they have (a collective or a barrier).
void counters_flush_warp(Block &b, int warp);
void counters_flush_block(Block &b);
// The log of the block's thread tid while counting (lane_log, cuda_emu.h), else null.
LaneLog *counters_lane(Block &b, int tid);

// Called by the emulation where it sees the instruction.
void count_ldmatrix(const uintptr_t addr[32], bool trans);
void count_mma(bool useful);
void count_barrier();
void count_shuffle();
void count_cp_async_commit(int in_flight);

// Whether reports are written (RA_EMU_COUNTERS, RA_EMU_COUNTERS_FILE, ra_emu_counters): tests
// that turn counting_on themselves read counters_last() instead.
extern bool counters_print;
// The launch's JSON line (kernel: its name in the launcher), written where the settings say.
void counters_report(const LaunchCounters &c);
// The last report of this process (tests).
std::string counters_last();

} // namespace ra_emu
