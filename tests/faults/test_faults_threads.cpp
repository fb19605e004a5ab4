// The fault scenarios (scenarios.hpp) over the threads transport: 4 ranks as threads of this
// process, RINGATTN_COMM_TIMEOUT = DEADLINE. Each scenario gets fresh comms, and its ranks'
// outcomes are judged after all threads have returned (none may hang: ctest's timeout).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <thread>

#include "faults/scenarios.hpp"

using namespace faults;

namespace {

constexpr int RANKS = 4;

std::vector<Outcomes> run_threads(const Scenario &s)
{
    std::vector<ringattn_comm_t> comms(RANKS);
    REQUIRE(ringattn_comm_create_threads(RANKS, comms.data()) == RINGATTN_SUCCESS);
    std::vector<Outcomes> outs(RANKS);
    std::vector<int> made(RANKS, 0);
    std::vector<std::thread> threads;
    for (int r = 0; r < RANKS; ++r)
        threads.emplace_back([&, r] {
            Rank rank(comms[(size_t)r]);
            if (rank.create().status != RINGATTN_SUCCESS) return;
            made[(size_t)r] = 1;
            outs[(size_t)r] = s.script(r, RANKS, rank);
        });
    for (auto &t : threads) t.join();
    for (auto c : comms) CHECK(ringattn_comm_destroy(c) == RINGATTN_SUCCESS);
    for (int r = 0; r < RANKS; ++r) REQUIRE(made[(size_t)r] == 1);
    return outs;
}

} // namespace

TEST_CASE("faults over threads: no wrong result, no hang, every rank fails the same way",
          "[faults]")
{
    setenv("RINGATTN_COMM_TIMEOUT", std::to_string(DEADLINE).c_str(), 1);
    for (const Scenario &s : scenarios()) {
        SECTION(s.name)
        {
            const std::vector<Outcomes> outs = run_threads(s);
            for (int r = 0; r < RANKS; ++r) judge_rank(s, r, outs[(size_t)r]);
        }
    }
}

TEST_CASE("a descriptor mismatch names the field on every rank", "[faults]")
{
    constexpr int P = 3;
    std::vector<ringattn_comm_t> comms(P);
    REQUIRE(ringattn_comm_create_threads(P, comms.data()) == RINGATTN_SUCCESS);
    std::vector<std::string> msgs(P);
    std::vector<ringattn_status_t> st(P);
    std::vector<std::thread> threads;
    for (int r = 0; r < P; ++r)
        threads.emplace_back([&, r] {
            ringattn_plan_desc_t d = problem_desc();
            if (r == 2) d.window_left = 7;
            ringattn_plan_t plan = nullptr;
            st[(size_t)r] = ringattn_plan_create(comms[(size_t)r], &d, &plan);
            msgs[(size_t)r] = ringattn_last_error();
            ringattn_plan_destroy(plan);
        });
    for (auto &t : threads) t.join();
    for (auto c : comms) ringattn_comm_destroy(c);
    for (int r = 0; r < P; ++r) {
        INFO("rank " << r << ": " << msgs[(size_t)r]);
        CHECK(st[(size_t)r] == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(msgs[(size_t)r].find("desc.window_left: differs between ranks") != std::string::npos);
    }
}
