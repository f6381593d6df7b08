//! Tests that measure a rate and so need the machine's CPUs to
//! themselves. Cargo runs test binaries one after another, so nothing
//! from the `fixtures` and `labs` binaries competes with these. Within
//! this binary tests still run two at a time: it holds one test today,
//! and a second one belongs here only if it can share the CPUs with it.
//!
//! The shared harness is the `rocev2_tests` library in `tests/src`.

mod high_rate;
