"""Compiler flags shared by every target of our own code (like abseil's ABSL_DEFAULT_COPTS)."""

ODB_COPTS = [
    "-Wall",
    "-Wextra",
    "-Werror",
    "-Wno-unused-parameter",
]

# Test code includes catch.hpp and third-party headers that trip a few warnings.
ODB_TEST_COPTS = ODB_COPTS + [
    "-Wno-sign-compare",
]
