//! Test support shared by the test suites and `encore info`'s self-check.
