// 2D context parallelism (ringattn.h: ulysses_size, ringattn_plan_create_2d): P_u-way Ulysses
// inside groups and a P_r-way ring across them, ranks as threads. Every grid of P = 4, 6 and 8
// (2 x 2, 2 x 3, 3 x 2, 2 x 4, 4 x 2; and the pure Ulysses and pure ring ends), every layout,
// the ring catalogue's masks (a window so narrow that whole shards are masked among them), the
// ragged varlen batch, GQA with H_kv below and at or above P_u, dynamic masks, softcap, ALiBi,
// sinks and dLSE: output, LSE and every gradient within SPEC 9 of the float64 oracle. A group
// of one rank is bitwise the flat ring. Refusals fail on every rank at once.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ring/mailbox_transport.hpp"
#include "ring/ring_check.hpp"
#include "support/cases.hpp"

using ratest::AttnConfig;
using ratest::Mask;
using ratest::Problem;
using ringtest::Result;
using ringtest::RunOptions;

namespace {

struct Grid {
    int pu, pr;
};

// The grids of the issue: P = 4 (2 x 2), 6 (2 x 3, 3 x 2) and 8 (2 x 4, 4 x 2).
const Grid grids[] = {{2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}};

// H = 12 splits over groups of 2, 3 and 4; kv heads split (H_kv = P_u) or replicated (H_kv <
// P_u: 1 on groups of 2 and 3, 2 on groups of 4).
AttnConfig grid_batch(const Mask &m, ringattn_dtype_t dt, const Grid &g, bool replicated)
{
    AttnConfig c = ratest::ring_batch(m, dt);
    c.H = 12;
    c.Hkv = replicated ? (g.pu == 4 ? 2 : 1) : g.pu;
    return c;
}

// The library splits the comm into groups of consecutive ranks (desc.ulysses_size).
RunOptions one_comm(int pu, bool strided = false)
{
    RunOptions o;
    o.desc_hook = [pu, strided](int, ringattn_plan_desc_t &d) {
        d.ulysses_size = pu;
        d.ulysses_strided = strided;
    };
    return o;
}

// The caller's two comms (ringattn_plan_create_2d): rank r is member r % P_u of group r / P_u.
// Threads comms of the backend's memory, or NCCL communicators (nccl: the emulation's fake
// NCCL), which each rank makes on its own thread (their creation waits for every member).
struct GridComms {
    std::vector<ringattn_comm_t> group, ring;
    ringtest::NcclEntry nccl{nullptr, nullptr};
    std::vector<std::vector<unsigned char>> group_ids, ring_ids;
    std::vector<std::unique_ptr<mailbox::Network>> nets; // custom: a network per comm
    int pu, pr;
    enum Kind { Threads, Nccl, Custom, CustomAlltoall };
    GridComms(int pu_, int pr_, Kind kind = Threads)
        : group((size_t)(pu_ * pr_)), ring((size_t)(pu_ * pr_)), pu(pu_), pr(pr_)
    {
        const bool use_nccl = kind == Nccl;
        if (kind == Custom || kind == CustomAlltoall) { // the caller's transport: a mailbox each
            for (int g = 0; g < pr; ++g) {
                nets.emplace_back(new mailbox::Network);
                nets.back()->any_thread = true; // made here, called on the ranks' threads
                nets.back()->with_alltoall = kind == CustomAlltoall;
                for (int m = 0; m < pu; ++m)
                    REQUIRE(nets.back()->make(m, pu, &group[(size_t)(g * pu + m)]) == 0);
            }
            for (int m = 0; m < pu; ++m) {
                nets.emplace_back(new mailbox::Network);
                nets.back()->any_thread = true;
                nets.back()->with_alltoall = kind == CustomAlltoall;
                for (int g = 0; g < pr; ++g)
                    REQUIRE(nets.back()->make(g, pr, &ring[(size_t)(g * pu + m)]) == 0);
            }
            return;
        }
        if (use_nccl) {
            nccl = ringtest::nccl_entry();
            REQUIRE(nccl);
            group_ids.assign((size_t)pr, std::vector<unsigned char>(128));
            ring_ids.assign((size_t)pu, std::vector<unsigned char>(128));
            for (auto *ids : {&group_ids, &ring_ids})
                for (auto &id : *ids) REQUIRE(nccl.get_id(id.data()) == 0);
            return;
        }
        std::vector<ringattn_comm_t> tmp((size_t)(pu > pr ? pu : pr));
        for (int g = 0; g < pr; ++g) {
            REQUIRE(ratest::make_thread_comms(pu, tmp.data()) == RINGATTN_SUCCESS);
            for (int m = 0; m < pu; ++m) group[(size_t)(g * pu + m)] = tmp[(size_t)m];
        }
        for (int m = 0; m < pu; ++m) {
            REQUIRE(ratest::make_thread_comms(pr, tmp.data()) == RINGATTN_SUCCESS);
            for (int g = 0; g < pr; ++g) ring[(size_t)(g * pu + m)] = tmp[(size_t)g];
        }
    }
    ~GridComms()
    {
        for (auto *v : {&group, &ring})
            for (ringattn_comm_t c : *v) ringattn_comm_destroy(c);
    }
    RunOptions options()
    {
        RunOptions o;
        o.make_plan = [this](int r, ringattn_comm_t, const ringattn_plan_desc_t &d,
                             ringattn_plan_t *plan) {
            const size_t g = (size_t)(r / pu), m = (size_t)(r % pu);
            if (nccl) { // this rank's two communicators, made on its thread
                ringattn_status_t st = nccl.create(group_ids[g].data(), pu, (int)m, -1,
                                                   &group[(size_t)r]);
                if (st == RINGATTN_SUCCESS)
                    st = nccl.create(ring_ids[m].data(), pr, (int)g, -1, &ring[(size_t)r]);
                if (st != RINGATTN_SUCCESS) return st;
            }
            return ringattn_plan_create_2d(group[(size_t)r], ring[(size_t)r], &d, plan);
        };
        return o;
    }
};

std::string label(const Grid &g, ringattn_layout_t layout, const char *how)
{
    return std::string(how) + " " + std::to_string(g.pu) + " x " + std::to_string(g.pr) +
           ", layout " + std::to_string(layout);
}

} // namespace

// The emulated CUDA backend runs a subset (its kernels are the ring tests'; here the moves):
// the narrow window and causal masks on 2 x 2 and 3 x 2 under zigzag.
bool in_subset(const Mask &m, const Grid &g, ringattn_layout_t layout)
{
    return !ratest::emulated() || ((m.wl == 5 || (m.causal && m.wl < 0)) && g.pr == 2 &&
                                   g.pu <= 3 && layout == RINGATTN_LAYOUT_ZIGZAG);
}

TEST_CASE("2D plans over one comm are within SPEC 9 for every grid, layout and mask", "[ulysses]")
{
    uint64_t seed = 100;
    int which = 0;
    for (const Mask &m : ratest::ring_masks)
        for (const Grid &g : grids) {
            if (!in_subset(m, g, RINGATTN_LAYOUT_ZIGZAG)) continue;
            const bool replicated = (which++) % 2;
            const Problem pb =
                ratest::packed_problem(grid_batch(m, RINGATTN_FLOAT32, g, replicated), seed++);
            const ratest::Spec9 judge = ringtest::judge_of(pb);
            INFO("mask " << m.name << ", H_kv " << pb.cfg.Hkv);
            for (ringattn_layout_t layout : ringtest::all_layouts)
                if (in_subset(m, g, layout))
                    ringtest::check_result(ringtest::run(pb, g.pu * g.pr, layout, one_comm(g.pu)),
                                           judge, pb, label(g, layout, "one comm"));
        }
}

TEST_CASE("2D plans over the caller's two comms, strided groups, pure Ulysses", "[ulysses]")
{
    uint64_t seed = 200;
    const Mask narrow = ratest::ring_masks[3], causal = ratest::ring_masks[1];
    for (const Grid &g : {Grid{2, 3}, Grid{4, 2}, Grid{4, 1}, Grid{2, 1}})
        for (bool replicated : {false, true}) {
            if (ratest::emulated() && (g.pu == 4 || (replicated && g.pr > 1))) continue;
            const Problem pb = ratest::packed_problem(
                grid_batch(replicated ? narrow : causal, RINGATTN_FLOAT32, g, replicated), seed++);
            const ratest::Spec9 judge = ringtest::judge_of(pb);
            INFO("H_kv " << pb.cfg.Hkv);
            for (ringattn_layout_t layout : ringtest::all_layouts) {
                if (ratest::emulated() && layout != RINGATTN_LAYOUT_STRIPED) continue;
                GridComms comms(g.pu, g.pr);
                ringtest::check_result(ringtest::run(pb, g.pu * g.pr, layout, comms.options()),
                                       judge, pb, label(g, layout, "two comms"));
            }
            ringtest::check_result(
                ringtest::run(pb, g.pu * g.pr, RINGATTN_LAYOUT_ZIGZAG, one_comm(g.pu, true)),
                judge, pb, label(g, RINGATTN_LAYOUT_ZIGZAG, "strided"));
        }
}

TEST_CASE("a group of one rank is bitwise the flat ring", "[ulysses]")
{
    uint64_t seed = 300;
    for (const Mask &m : {ratest::ring_masks[1], ratest::ring_masks[3], ratest::ring_masks[4]})
        for (ringattn_layout_t layout : ringtest::all_layouts)
            for (int pr : {2, 3}) {
                if (ratest::emulated() && (pr == 2 || layout != RINGATTN_LAYOUT_ZIGZAG)) continue;
                AttnConfig c = ratest::ring_batch(m, RINGATTN_BFLOAT16);
                c = ratest::with_bias(c, 2, 0);
                const Problem pb = ratest::packed_problem(c, seed++);
                GridComms comms(1, pr);
                const Result grid = ringtest::run(pb, pr, layout, comms.options());
                const Result flat = ringtest::run(pb, pr, layout);
                INFO("mask " << m.name << ", layout " << layout << ", P_r " << pr);
                REQUIRE(grid.status == RINGATTN_SUCCESS);
                REQUIRE(flat.status == RINGATTN_SUCCESS);
                ringtest::check_bitwise_same(grid, flat);
            }
}

TEST_CASE("2D plans in bfloat16, with dynamic masks, softcap, ALiBi, sinks and dLSE", "[ulysses]")
{
    uint64_t seed = 400;
    for (const Grid &g : {Grid{2, 2}, Grid{3, 2}, Grid{2, 4}})
        for (bool replicated : {false, true}) {
            if (ratest::emulated() && g.pu * g.pr != 4) continue;
            AttnConfig c = grid_batch(ratest::ring_masks[5], RINGATTN_BFLOAT16, g, replicated);
            const Problem pb = ratest::packed_problem(c, seed++);
            ringtest::check_result(ringtest::run(pb, g.pu * g.pr, RINGATTN_LAYOUT_ZIGZAG,
                                                 one_comm(g.pu)),
                                   ringtest::judge_of(pb), pb, label(g, RINGATTN_LAYOUT_ZIGZAG,
                                                                     "bfloat16"));
            // a key bias of 1, H_kv or H heads with a top-k over each whole sequence (SPEC 6)
            for (int hb : {1, c.Hkv, c.H}) {
                const Problem pd = ratest::packed_problem(ratest::with_bias(c, hb, 9), seed++);
                ringtest::check_result(ringtest::run(pd, g.pu * g.pr, RINGATTN_LAYOUT_STRIPED,
                                                     one_comm(g.pu)),
                                       ringtest::judge_of(pd), pd,
                                       label(g, RINGATTN_LAYOUT_STRIPED, "dynamic"));
            }
            AttnConfig o = grid_batch(ratest::ring_masks[2], RINGATTN_FLOAT32, g, replicated);
            o.softcap = 5.0f;
            o.alibi = ratest::alibi_slopes(o.H);
            std::mt19937_64 rng(seed);
            std::normal_distribution<double> nd(0.0, 2.0);
            o.sinks.resize((size_t)o.H);
            for (double &x : o.sinks) x = nd(rng);
            o.sinks[1] = -INFINITY; // one head without a sink
            o.dlse.resize((size_t)(o.H * o.Tq()));
            for (double &x : o.dlse) x = nd(rng) / 2;
            const Problem po = ratest::packed_problem(o, seed++);
            ringtest::check_result(ringtest::run(po, g.pu * g.pr, RINGATTN_LAYOUT_CONTIGUOUS,
                                                 one_comm(g.pu)),
                                   ringtest::judge_of(po), po,
                                   label(g, RINGATTN_LAYOUT_CONTIGUOUS, "options"));
        }
}

TEST_CASE("2D plans over two comms of a custom transport (the caller's callbacks)", "[ulysses]")
{
    if (!ratest::device_memory().is_host()) return; // the custom transport moves host memory
    uint64_t seed = 700;
    for (const Grid &g : {Grid{2, 2}, Grid{3, 2}})
        for (bool replicated : {false, true}) {
            // with the transport's alltoall_start (one request) or without (rounds of batches)
            const bool a2a_entry = replicated;
            const Problem pb = ratest::packed_problem(
                grid_batch(ratest::ring_masks[3], RINGATTN_FLOAT32, g, replicated), seed++);
            GridComms comms(g.pu, g.pr, a2a_entry ? GridComms::CustomAlltoall : GridComms::Custom);
            RunOptions o = comms.options();
            // what each rank's plan says it sends per forward and backward, on both comms
            std::vector<ringattn_plan_info_t> info((size_t)(g.pu * g.pr));
            const auto make = o.make_plan;
            o.make_plan = [&, make](int r, ringattn_comm_t c, const ringattn_plan_desc_t &d,
                                    ringattn_plan_t *plan) {
                const ringattn_status_t st = make(r, c, d, plan);
                if (st == RINGATTN_SUCCESS) {
                    info[(size_t)r] = RINGATTN_PLAN_INFO_INIT;
                    ringattn_plan_get_info(*plan, &info[(size_t)r]);
                }
                return st;
            };
            ringtest::check_result(ringtest::run(pb, g.pu * g.pr, RINGATTN_LAYOUT_ZIGZAG, o),
                                   ringtest::judge_of(pb), pb,
                                   label(g, RINGATTN_LAYOUT_ZIGZAG, "custom"));
            // the bytes that moved are the plan info's: a forward and a backward per rank,
            // the all-to-all on the group's mailbox, the ring on the ring's
            for (int r = 0; r < g.pu * g.pr; ++r) {
                const ringattn_plan_info_t &i = info[(size_t)r];
                INFO("rank " << r);
                CHECK(i.ulysses_size == g.pu);
                CHECK(i.ring_size == g.pr);
                const size_t a2a = comms.nets[(size_t)(r / g.pu)]->of(r % g.pu).bytes_sent;
                const size_t ring = comms.nets[(size_t)(g.pr + r % g.pu)]->of(r / g.pu).bytes_sent;
                CHECK(a2a == i.alltoall_forward_bytes_sent + i.alltoall_backward_bytes_sent);
                const int entries = comms.nets[(size_t)(r / g.pu)]->of(r % g.pu).alltoalls;
                CHECK((entries > 0) == a2a_entry); // the entry, where the transport has it
                CHECK(ring == i.forward_bytes_sent + i.backward_bytes_sent);
                CHECK(a2a > 0);
            }
        }
}

TEST_CASE("2D plans over NCCL communicators of the caller's (the fake NCCL)", "[ulysses]")
{
    if (!ratest::emulated()) return; // a GPU's NCCL: tests/mpi's NCCL job
    uint64_t seed = 600;
    for (bool replicated : {false, true}) {
        const Grid g{2, 2};
        const Problem pb = ratest::packed_problem(
            grid_batch(ratest::ring_masks[3], RINGATTN_BFLOAT16, g, replicated), seed++);
        GridComms comms(g.pu, g.pr, GridComms::Nccl);
        ringtest::check_result(ringtest::run(pb, g.pu * g.pr, RINGATTN_LAYOUT_ZIGZAG,
                                             comms.options()),
                               ringtest::judge_of(pb), pb,
                               label(g, RINGATTN_LAYOUT_ZIGZAG, "nccl"));
    }
}

TEST_CASE("2D plans with a head dimension of 1 and one kv head (strides of either layout)",
          "[ulysses]")
{
    // K [T, 1, 1] has the strides of a [1, T] tensor: the moves must know its layout. The
    // CUDA kernels take head dims in multiples of 8: the CPU backend's moves are the same code
    if (!ratest::device_memory().is_host()) return;
    for (ringattn_dtype_t dt : {RINGATTN_FLOAT32, RINGATTN_BFLOAT16}) {
        AttnConfig c = ratest::ring_batch(ratest::ring_masks[1], dt);
        c.H = 2, c.Hkv = 1, c.D = 1;
        const Problem pb = ratest::packed_problem(c, 800 + (uint64_t)dt);
        ringtest::check_result(ringtest::run(pb, 4, RINGATTN_LAYOUT_ZIGZAG, one_comm(2)),
                               ringtest::judge_of(pb), pb, "D = 1, H_kv = 1, 2 x 2");
    }
}

TEST_CASE("a 2D call on a stream capturing a CUDA graph is refused on every rank", "[ulysses]")
{
    // its agreements wait on the host: refused before anything is queued (the all-to-all
    // included); the same plan then runs as usual
    if (ratest::device_memory().is_host()) return; // no streams on the CPU backend
    const Grid g{2, 2};
    const Problem pb = ratest::packed_problem(
        grid_batch(ratest::ring_masks[1], RINGATTN_BFLOAT16, g, false), 900);
    RunOptions opt = one_comm(g.pu);
    opt.capture_first_call = true;
    const Result r = ringtest::run(pb, g.pu * g.pr, RINGATTN_LAYOUT_ZIGZAG, opt);
    for (ringattn_status_t st : r.edited_status) CHECK(st == RINGATTN_ERR_UNSUPPORTED);
    ringtest::check_result(r, ringtest::judge_of(pb), pb, "after the capture");
}

TEST_CASE("2D plans that cannot be made fail on every rank at once", "[ulysses]")
{
    const Problem pb = ratest::packed_problem(grid_batch(ratest::ring_masks[1], RINGATTN_FLOAT32,
                                                         {2, 2}, false), 500);
    struct Refusal {
        const char *what;
        int ranks;
        std::function<void(int, ringattn_plan_desc_t &)> hook;
        ringattn_status_t status;
    };
    const Refusal refusals[] = {
        {"heads not split evenly", 4,
         [](int, ringattn_plan_desc_t &d) { d.ulysses_size = 2, d.num_heads = 9, d.num_kv_heads = 3; },
         RINGATTN_ERR_INVALID_ARGUMENT},
        {"kv heads neither a multiple nor a divisor", 6,
         [](int, ringattn_plan_desc_t &d) { d.ulysses_size = 3, d.num_kv_heads = 2; },
         RINGATTN_ERR_INVALID_ARGUMENT},
        {"ranks not a multiple of the group", 6,
         [](int, ringattn_plan_desc_t &d) { d.ulysses_size = 4; }, RINGATTN_ERR_INVALID_ARGUMENT},
        {"one rank's ulysses_size differs", 4,
         [](int r, ringattn_plan_desc_t &d) { d.ulysses_size = r == 3 ? 0 : 2; },
         RINGATTN_ERR_INVALID_ARGUMENT},
    };
    for (const Refusal &f : refusals) {
        INFO(f.what);
        RunOptions o;
        o.desc_hook = f.hook;
        const auto t0 = std::chrono::steady_clock::now();
        const Result r = ringtest::run(pb, f.ranks, RINGATTN_LAYOUT_CONTIGUOUS, o);
        CHECK(r.status == f.status);
        for (ringattn_status_t st : r.rank_status) CHECK(st != RINGATTN_SUCCESS);
        CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
    }
}
