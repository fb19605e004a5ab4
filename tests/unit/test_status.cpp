// Status strings, last-error and version of the public API.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>

#include "ringattn.h"

static const ringattn_status_t all_codes[] = {
    RINGATTN_SUCCESS,          RINGATTN_ERR_INVALID_ARGUMENT, RINGATTN_ERR_INVALID_USAGE,
    RINGATTN_ERR_UNSUPPORTED,  RINGATTN_ERR_OUT_OF_MEMORY,    RINGATTN_ERR_COMM,
    RINGATTN_ERR_CUDA,         RINGATTN_ERR_INTERNAL};

TEST_CASE("every status code has a distinct non-empty string", "[status]")
{
    std::set<std::string> seen;
    for (ringattn_status_t s : all_codes) {
        const char *str = ringattn_status_string(s);
        INFO("code " << (int)s);
        REQUIRE(str != nullptr);
        CHECK(std::strlen(str) > 0);
        CHECK(seen.insert(str).second);
    }
    CHECK(seen.size() == sizeof all_codes / sizeof all_codes[0]);
}

TEST_CASE("every status code has its enumerator's name", "[status]")
{
    const char *names[] = {"RINGATTN_SUCCESS",           "RINGATTN_ERR_INVALID_ARGUMENT",
                           "RINGATTN_ERR_INVALID_USAGE", "RINGATTN_ERR_UNSUPPORTED",
                           "RINGATTN_ERR_OUT_OF_MEMORY", "RINGATTN_ERR_COMM",
                           "RINGATTN_ERR_CUDA",          "RINGATTN_ERR_INTERNAL"};
    static_assert(sizeof names / sizeof names[0] == sizeof all_codes / sizeof all_codes[0], "");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; ++i)
        CHECK(std::string(ringattn_status_name(all_codes[i])) == names[i]);
    for (int code : {-1, 8, 99})
        CHECK(std::string(ringattn_status_name((ringattn_status_t)code)) == "RINGATTN_STATUS_UNKNOWN");
}

TEST_CASE("unknown status codes still give a non-empty string", "[status]")
{
    for (int code : {-1, 8, 99, 12345, -2147483647}) {
        const char *str = ringattn_status_string((ringattn_status_t)code);
        INFO("code " << code);
        REQUIRE(str != nullptr);
        CHECK(std::strlen(str) > 0);
        // It must not claim success.
        CHECK(std::string(str) != ringattn_status_string(RINGATTN_SUCCESS));
    }
}

TEST_CASE("version macro, number and string agree", "[status]")
{
    CHECK(RINGATTN_VERSION == RINGATTN_VERSION_MAJOR * 10000 + RINGATTN_VERSION_MINOR * 100 +
                                  RINGATTN_VERSION_PATCH);
    CHECK(ringattn_version() == RINGATTN_VERSION);
    const char *vs = ringattn_version_string();
    REQUIRE(vs != nullptr);
    char expect[64];
    std::snprintf(expect, sizeof expect, "%d.%d.%d", RINGATTN_VERSION_MAJOR,
                  RINGATTN_VERSION_MINOR, RINGATTN_VERSION_PATCH);
    // The string starts with MAJOR.MINOR.PATCH (a suffix such as "-dev" or a git hash may follow,
    // separated by a non-digit).
    REQUIRE(std::strncmp(vs, expect, std::strlen(expect)) == 0);
    const char next = vs[std::strlen(expect)];
    CHECK((next == '\0' || !(next >= '0' && next <= '9')));
}

TEST_CASE("last_error is a valid string before and after a failure", "[status]")
{
    const char *e = ringattn_last_error();
    REQUIRE(e != nullptr);
    ringattn_plan_t plan = nullptr;
    REQUIRE(ringattn_plan_create(nullptr, nullptr, &plan) != RINGATTN_SUCCESS);
    e = ringattn_last_error();
    REQUIRE(e != nullptr);
    CHECK(std::strlen(e) > 0);
    CHECK(plan == nullptr);
}
