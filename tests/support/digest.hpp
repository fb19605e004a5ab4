// Output digests for bitwise comparisons across builds: with RATEST_DIGESTS=<dir> in the
// environment, every call the support code runs (a forward, a backward, a ring) appends one line
// to <dir>/<program>_<backend>[_<transport>].txt -- the test case, the call's number within it,
// its kind and a hash of its outputs' bytes. A change that must not move a bit (a refactoring)
// is checked by running the same tests on both builds and diffing the two folders
// (docs/DESIGN.md, "Testing"). Without the variable nothing is written.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <utility>

namespace ratest {

using Bytes = std::pair<const void *, size_t>;

void digest(const char *kind, std::initializer_list<Bytes> outputs);

} // namespace ratest
