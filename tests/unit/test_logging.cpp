// Logging (README, "Logging"; base/log.c): the callback of ringattn_set_log_callback
// gets a ring plan's info lines with their subsystem and rank; a failed call's log line is its
// message; and, run with RINGATTN_LOG_FILE / _SUBSYS / _TIME set (the [logfile] test, a
// registration of its own), one file per rank whose every line starts host:pid:rank and the
// time, without the subsystem the filter leaves out, and a comm failure's line in the failing
// rank's file naming the same call, rank, peer and step as its message.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "ring/ring_harness.hpp"
#include "support/cases.hpp"
#include "support/shim.hpp"

namespace {

struct Line {
    ringattn_log_level_t level;
    std::string subsystem;
    int rank, ranks;
    std::string message;
};

std::mutex mu;
std::vector<Line> lines;

void collect(void *user, ringattn_log_level_t level, const char *subsystem, int rank, int ranks,
             const char *message)
{
    std::lock_guard<std::mutex> lk(mu);
    ++*static_cast<int *>(user);
    lines.push_back({level, subsystem, rank, ranks, message});
}

// Lines logged while f runs, at up to `level`, through the callback.
template <class F>
std::vector<Line> logged(ringattn_log_level_t level, F f)
{
    int calls = 0;
    lines.clear();
    REQUIRE(ringattn_set_log_callback(collect, &calls, level) == RINGATTN_SUCCESS);
    f();
    REQUIRE(ringattn_set_log_callback(nullptr, nullptr, RINGATTN_LOG_OFF) == RINGATTN_SUCCESS);
    CHECK(calls == (int)lines.size());
    return lines;
}

ratest::Problem ring_problem()
{
    return ratest::packed_problem(ratest::ring_batch({"causal", 1, -1, -1}), 31);
}

// A forward call refused for having no tensors at all; its message.
std::string refused_forward(const ratest::Problem &pb)
{
    ratest::Plan plan(pb.cfg);
    ratest::require_plan(plan);
    ringattn_tensors_t t = RINGATTN_TENSORS_INIT;
    CHECK(ringattn_forward(plan.get(), &t, nullptr) == RINGATTN_ERR_INVALID_ARGUMENT);
    return ringattn_last_error();
}

// Rank 0's forward over a 2-rank threads comm while rank 1 never calls: after the deadline
// (RINGATTN_COMM_TIMEOUT) rank 0 fails with RINGATTN_ERR_COMM; its message.
std::string comm_failure(const ratest::Problem &pb)
{
    ringattn_comm_t comms[2];
    REQUIRE(ringtest::make_thread_comms(2, comms) == RINGATTN_SUCCESS);
    std::string message;
    ringattn_status_t status = RINGATTN_SUCCESS;
    std::vector<std::thread> th;
    for (int r = 0; r < 2; ++r)
        th.emplace_back([&, r] {
            ringattn_plan_desc_t d = ratest::make_desc(pb.cfg);
            ringattn_plan_t plan = nullptr;
            if (ringattn_plan_create(comms[r], &d, &plan) != RINGATTN_SUCCESS) return;
            if (r == 0) {
                ringattn_tensors_t t = RINGATTN_TENSORS_INIT; // never read: the agreement fails
                // every tensor of the call fits: T_q rows of H x D (the local ones are fewer)
                std::vector<float> buf((size_t)pb.cfg.Tq() * pb.cfg.H * pb.cfg.D, 0.0f);
                t.q.data = t.k.data = t.v.data = t.o.data = buf.data();
                t.lse = buf.data();
                status = ringattn_forward(plan, &t, nullptr);
                message = ringattn_last_error();
            } else {
                std::this_thread::sleep_for(std::chrono::seconds(3));
            }
            ringattn_plan_destroy(plan);
        });
    for (auto &t : th) t.join();
    for (auto c : comms) ringattn_comm_destroy(c);
    CHECK(status == RINGATTN_ERR_COMM);
    return message;
}

} // namespace

TEST_CASE("The log callback gets a ring plan's info lines, with subsystem and rank")
{
    const ratest::Problem pb = ring_problem();
    const std::vector<Line> got = logged(RINGATTN_LOG_INFO, [&] {
        REQUIRE(ringtest::run(pb, 2, RINGATTN_LAYOUT_ZIGZAG).status ==
                RINGATTN_SUCCESS);
    });
    int schedule[2] = {0, 0}, plan[2] = {0, 0};
    for (const Line &l : got) {
        INFO(l.subsystem << " " << l.rank << "/" << l.ranks << ": " << l.message);
        CHECK(l.level <= RINGATTN_LOG_INFO);
        CHECK((l.subsystem == "plan" || l.subsystem == "ring" || l.subsystem == "comm" ||
               l.subsystem == "kernels"));
        if (l.subsystem != "plan") continue;
        REQUIRE((l.rank == 0 || l.rank == 1));
        CHECK(l.ranks == 2);
        schedule[l.rank] += l.message.rfind("schedule: ", 0) == 0;
        plan[l.rank] += l.message.rfind("plan: ", 0) == 0;
    }
    for (int r = 0; r < 2; ++r) {
        CHECK(schedule[r] == 1);
        CHECK(plan[r] == 1);
    }
    // below its level the callback gets nothing of a plan
    CHECK(logged(RINGATTN_LOG_WARN, [&] { ringtest::run(pb, 2, RINGATTN_LAYOUT_ZIGZAG); }).empty());
    CHECK(ringattn_set_log_callback(collect, nullptr, (ringattn_log_level_t)9) ==
          RINGATTN_ERR_INVALID_ARGUMENT);
}

TEST_CASE("A failed call's log line is its message")
{
    const ratest::Problem pb = ring_problem();
    std::string message;
    const std::vector<Line> got = logged(RINGATTN_LOG_INFO, [&] {
        message = refused_forward(pb);
    });
    REQUIRE(!got.empty());
    const Line &l = got.back();
    CHECK(l.subsystem == "ring");
    CHECK(l.level == RINGATTN_LOG_INFO); // a refusal: the caller has the status and message
    CHECK(l.rank == 0);
    CHECK(l.message == message + " (invalid argument)");
}

TEST_CASE("At debug level a failure leaves its trail: file:line -> status, from the check up")
{
    const ratest::Problem pb = ring_problem();
    std::string message;
    const std::vector<Line> got = logged(RINGATTN_LOG_DEBUG, [&] {
        message = refused_forward(pb);
    });
    std::vector<std::string> trail;
    for (const Line &l : got)
        if (l.subsystem == "error") trail.push_back(l.message);
    REQUIRE(!trail.empty());
    INFO("first: " << trail.front());
    // the check that refused: a source file of the tree (relative), its line, status and message
    CHECK(trail.front().find(".c:") != std::string::npos);
    CHECK(trail.front().find('/') != 0);
    CHECK(trail.front().find(" -> RINGATTN_ERR_INVALID_ARGUMENT: " + message) != std::string::npos);
    for (const std::string &m : trail) CHECK(m.find(" -> RINGATTN_ERR_INVALID_ARGUMENT") != std::string::npos);
    // nothing of the kind below debug
    const std::vector<Line> info = logged(RINGATTN_LOG_INFO, [&] { refused_forward(pb); });
    for (const Line &l : info) CHECK(l.subsystem != "error");
}

TEST_CASE("RINGATTN_LOG_FILE, _SUBSYS and _TIME: a file per rank, host:pid:rank and the time on "
          "every line, a comm failure's line naming what its message names",
          "[.logfile]")
{
    const char *pattern = std::getenv("RINGATTN_LOG_FILE");
    REQUIRE(pattern != nullptr); // this test runs with the environment tests/CMakeLists.txt sets
    const ratest::Problem pb = ring_problem();
    REQUIRE(ringtest::run(pb, 2, RINGATTN_LAYOUT_ZIGZAG).status == RINGATTN_SUCCESS);
    const std::string failure = comm_failure(pb);
    char host[64];
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    std::string short_host(host);
    short_host = short_host.substr(0, short_host.find('.'));
    const std::string pid = std::to_string((long)getpid());
    for (int r = 0; r < 2; ++r) {
        std::string name = pattern;
        for (auto [key, value] : {std::pair<std::string, std::string>{"%h", short_host},
                                  {"%p", pid}, {"%r", std::to_string(r)}})
            name.replace(name.find(key), 2, value);
        std::ifstream in(name);
        INFO("log file " << name);
        REQUIRE(in.good());
        const std::regex line_re(short_host + ":" + pid + ":" + std::to_string(r) +
                                 " \\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\d\\.\\d{6} ringattn "
                                 "(WARN|INFO|DEBUG|TRACE) (plan|ring|comm|kernels): (.*)");
        int n = 0, plan_lines = 0, failures = 0;
        for (std::string line; std::getline(in, line); ++n) {
            INFO(line);
            std::smatch m;
            REQUIRE(std::regex_match(line, m, line_re));
            CHECK(m[2] != "kernels"); // RINGATTN_LOG_SUBSYS=^kernels
            plan_lines += m[2] == "plan";
            if (m[1] == "WARN" && m[2] == "ring") {
                ++failures;
                CHECK(m[3] == failure + " (communication error)");
            }
        }
        CHECK(plan_lines >= 2);
        CHECK(failures == (r == 0 ? 1 : 0));
    }
    // the message names the call, the rank and what it waited for
    CHECK(failure.find("ringattn_forward") != std::string::npos);
    CHECK(failure.find("rank 0") != std::string::npos);
}
