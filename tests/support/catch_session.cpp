// Catch2's implementation, compiled once for every test executable (catch.hpp's implementation
// is most of a test build's time): the mains (catch_main.cpp, mpi/mpi_main.cpp,
// faults/test_faults_mpi.cpp) run the session through ra_catch_run.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_session.hpp"

int ra_catch_run(int argc, char **argv) { return Catch::Session().run(argc, argv); }
