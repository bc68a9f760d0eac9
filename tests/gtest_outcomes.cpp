// Three GoogleTest tests that pass, skip and fail on purpose: real GoogleTest output for
// tests/gtest_outcome_check.sh, which checks how scripts/gpu_check.sh counts a test run in a process
// of its own. Not a suite of duet's (ctest does not discover it).
#include <gtest/gtest.h>

TEST(Outcome, Passes) { EXPECT_EQ(1 + 1, 2); }
TEST(Outcome, Skips) { GTEST_SKIP() << "skipped by design (no second GPU)"; }
TEST(Outcome, Fails) { EXPECT_EQ(1 + 1, 3) << "fails on purpose"; }
