// One compiled Catch2 main shared by every test executable (catch.hpp's main is slow to build).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
