// The Catch2 session of catch_session.cpp, for the tests' own mains.
#pragma once

// Catch::Session().run(argc, argv): the tests selected by the command line; Catch's exit code.
int ra_catch_run(int argc, char **argv);
