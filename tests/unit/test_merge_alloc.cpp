// ringattn_merge_partials validates every argument before it allocates (DESIGN: errors): an
// invalid call is RINGATTN_ERR_INVALID_ARGUMENT even when no memory is left, and a valid call
// that finds no memory is RINGATTN_ERR_OUT_OF_MEMORY with nothing written.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "ringattn.h"

#include "support/alloc_fault.hpp"

#if !defined(__SANITIZE_ADDRESS__)
TEST_CASE("merge: invalid arguments are reported as such when no memory is left", "[merge][alloc]")
{
    const int T = 5, H = 2, Dv = 4, n = 2;
    std::vector<float> o0((size_t)T * H * Dv, 1.0f), o1(o0.size(), 2.0f), out(o0.size(), -7.0f);
    std::vector<float> l0((size_t)H * T, 0.0f), l1(l0.size(), 1.0f), out_lse(l0.size(), -7.0f);
    const float *lses[2] = {l0.data(), l1.data()};
    const float *null_lses[2] = {l0.data(), nullptr};
    ringattn_tensor_t parts[2] = {{o0.data(), 0, 0}, {o1.data(), 0, 0}};
    ringattn_tensor_t bad_parts[2] = {{o0.data(), 0, 0}, {o1.data(), -1, 0}};
    const ringattn_tensor_t o = {out.data(), 0, 0};
    const ringattn_tensor_t overlapping = {out.data(), 1, 1};
    struct Case {
        const char *what, *names;
        int H;
        ringattn_dtype_t dt;
        const ringattn_tensor_t *parts;
        const float *const *lses;
        ringattn_tensor_t out;
    };
    const Case cases[] = {
        {"num_heads 0", "num_heads", 0, RINGATTN_FLOAT32, parts, lses, o},
        {"dtype 7", "dtype", H, (ringattn_dtype_t)7, parts, lses, o},
        {"parts_o NULL", "parts_o", H, RINGATTN_FLOAT32, nullptr, lses, o},
        {"parts_lse[1] NULL", "parts_lse[1]", H, RINGATTN_FLOAT32, parts, null_lses, o},
        {"parts_o[1] negative stride", "parts_o[1]", H, RINGATTN_FLOAT32, bad_parts, lses, o},
        {"out_o overlapping itself", "out_o", H, RINGATTN_FLOAT32, parts, lses, overlapping},
    };
    for (const Case &c : cases) {
        INFO(c.what);
        allocfault::arm(); // every allocation fails
        const ringattn_status_t st = ringattn_merge_partials(n, T, c.H, Dv, c.dt, c.parts, c.lses,
                                                             c.out, out_lse.data());
        allocfault::disarm();
        CHECK(st == RINGATTN_ERR_INVALID_ARGUMENT);
        CHECK(std::strstr(ringattn_last_error(), c.names) != nullptr);
        CHECK(allocfault::refused() == 0); // not even asked for memory
    }
    // A valid merge without memory: out of memory, nothing written.
    allocfault::arm();
    const ringattn_status_t st =
        ringattn_merge_partials(n, T, H, Dv, RINGATTN_FLOAT32, parts, lses, o, out_lse.data());
    allocfault::disarm();
    CHECK(st == RINGATTN_ERR_OUT_OF_MEMORY);
    CHECK(std::strstr(ringattn_last_error(), "ringattn_merge_partials") != nullptr);
    CHECK(out == std::vector<float>(out.size(), -7.0f));
    CHECK(out_lse == std::vector<float>(out_lse.size(), -7.0f));
    // ... and with memory it merges.
    CHECK(ringattn_merge_partials(n, T, H, Dv, RINGATTN_FLOAT32, parts, lses, o, out_lse.data()) ==
          RINGATTN_SUCCESS);
    CHECK(out != std::vector<float>(out.size(), -7.0f));
}
#else
TEST_CASE("merge: invalid arguments when no memory is left (needs libc's allocator)", "[merge][alloc]")
{
    WARN("skipped under AddressSanitizer: the malloc interposer would bypass its allocator");
}
#endif
