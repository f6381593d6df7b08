//! `rocev2 --version`: the workspace version and the commit it was built
//! from. A crate of its own: its build script re-runs when HEAD moves, and
//! in rocev2-user that would also rebuild the eBPF programs on every commit.
#![no_std]

/// The commit of the checkout (12 hex digits), the `ROCEV2_GIT_COMMIT`
/// variable when building outside git (a tarball, a package recipe), or
/// "unknown".
pub const COMMIT: &str = env!("ROCEV2_GIT_COMMIT");

/// "0.1.0 (commit 0123456789ab)".
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("ROCEV2_GIT_COMMIT"), ")");
