// Catch2 entry point for normlab_tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
