// Runs one problem (support/shim.hpp's Problem: its config and its global, packed inputs) on P
// ranks of a ring, or on the single-rank plan, through the public API only, and gathers the
// ranks' local outputs back into global order (ringattn_plan_local_tokens). The tests judge
// the gathered result against the float64 oracle (ring_check.hpp).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ringattn.h"
#include "support/device.hpp"
#include "support/shim.hpp"
#include "support/spec9.hpp"

namespace ringtest {

// The transport run() gives its ranks when the options name none (RATEST_TRANSPORT): threads
// (the default: the threads transport of the backend's memory, device-copy for a device
// backend), custom (the mailbox of ring/mailbox_transport.hpp, host memory) or nccl (NCCL with
// a communicator per rank: the fake NCCL on the emulation).
std::string test_transport();

struct RunOptions {
    // Changes a rank's descriptor before plan creation (mismatch tests).
    std::function<void(int, ringattn_plan_desc_t &)> desc_hook;
    // Bad-argument tests: when set, every rank first calls ringattn_forward with its tensors as
    // edited here (rank, tensors), records the status in Result.edited_status[rank], and then
    // runs the forward and backward with its real tensors on the same plan.
    std::function<void(int, ringattn_tensors_t &)> edit_first_call;
    // The ranks' comm: the threads transport (of the backend's memory), or NCCL with each rank
    // on a communicator of its own from one unique id (the library must bring NCCL: the
    // emulated one brings the fake).
    bool nccl = false;
    // Otherwise, when set, each rank's thread makes its own comm, make_comm(rank, ranks, &comm),
    // and destroys it after its calls (a transport of the test's); unset: the threads transport.
    std::function<ringattn_status_t(int, int, ringattn_comm_t *)> make_comm;
    // Makes a rank's plan instead of ringattn_plan_create(comm, desc) (a 2D plan over comms of
    // the test's own: ringattn_plan_create_2d).
    std::function<ringattn_status_t(int, ringattn_comm_t, const ringattn_plan_desc_t &,
                                    ringattn_plan_t *)>
        make_plan;
    // Called on each rank's thread after its calls, before its plan is destroyed.
    std::function<void(int)> after_calls;
    // This rank makes its plan and leaves without a call (the others' calls must fail).
    int leave_rank = -1;
    // A device backend: every rank first calls ringattn_forward on its stream while the stream
    // captures a CUDA graph (relaxed mode), records the status in Result.edited_status[rank],
    // ends the capture and then runs as usual.
    bool capture_first_call = false;
    // A device backend: every rank's calls on the legacy default stream (stream NULL), one for
    // all ranks of the device, instead of a stream of its own.
    bool default_stream = false;
};

// Outputs in global order, as float (converted from the dtype); dbias [H_b, T], empty when the
// problem has no bias or does not want dBias.
struct Result {
    std::vector<float> o, lse, dq, dk, dv, dbias;
    std::vector<float> dsinks_ranks; // SPEC 11: [ranks, H], each rank's dsinks (with sinks)
    ringattn_status_t status = RINGATTN_SUCCESS;
    std::vector<ringattn_status_t> edited_status; // [ranks], with RunOptions.edit_first_call
    std::vector<ringattn_status_t> rank_status;   // [ranks]: each rank's failure, or SUCCESS
    std::vector<std::string> rank_error;          // [ranks]: its last error at that failure
    ratest::Got got(const ratest::AttnConfig &cfg) const; // as float64, for SPEC 9
};

// NCCL's ncclGetUniqueId and ringattn_comm_create_nccl_id, found by name: the library under
// test brings them (the emulated one its fake NCCL, a CUDA build with RINGATTN_ENABLE_NCCL the
// real one), not the test's link. Both null without NCCL.
struct NcclEntry {
    int (*get_id)(void *id); // ncclUniqueId: 128 bytes
    ringattn_status_t (*create)(const void *id, int nranks, int rank, int device,
                                ringattn_comm_t *out);
    explicit operator bool() const { return get_id && create; }
};
NcclEntry nccl_entry();

using ratest::make_thread_comms;

// The problem's outputs, every entry `fill`: the shape of a Result, made without a call.
Result blank(const ratest::Problem &pb, float fill);

// The problem on `ranks` ranks as threads (ranks = 0: the single-rank plan, no comm). The
// problem's inputs must be packed (Storage::Packed).
Result run(const ratest::Problem &pb, int ranks, ringattn_layout_t layout,
           const RunOptions &opt = RunOptions());

// This process's part as rank `rank` of comm (an MPI job, say): the global result with only
// this rank's tokens filled in and every other entry 0, so that summing the ranks' results
// (an allreduce) gives the global result exactly.
Result run_rank(const ratest::Problem &pb, ringattn_comm_t comm, int rank,
                ringattn_layout_t layout, const RunOptions &opt = RunOptions());

} // namespace ringtest
