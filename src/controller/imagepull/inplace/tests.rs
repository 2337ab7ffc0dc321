//! Tests of one in-place attempt against the in-memory image service of the task tests.
