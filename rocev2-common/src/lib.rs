//! Types and pure decision logic shared by the rocev2 eBPF programs, the
//! control program, the simulators and the tests.
//!
//! Everything here is `no_std` and free of kernel helpers, so the exact same
//! code runs in the XDP program and in host unit tests. Map value types are
//! `#[repr(C)]` with explicit padding and a compile-time size check; the
//! `user` feature adds `aya::Pod` for userspace, and serde and clap's
//! `ValueEnum` to the enums that have a text form.
#![no_std]

// clap's derive names `std` paths; only userspace builds and tests use it.
#[cfg(any(feature = "user", test))]
extern crate std;

pub mod arrival;
pub mod bth;
pub mod buckets;
pub mod checksum;
pub mod class;
pub mod counters;
pub mod ecn;
pub mod features;
pub mod flowlet;
pub mod hash;
pub mod maps;
pub mod rng;
pub mod telemetry;
pub mod text;

/// How many chained operations each of `rocev2 bench`'s primitive programs
/// does (the tools object's `rocev2_prim_*`); the bench divides each
/// program's time above the floor by it.
pub const BENCH_PRIMITIVE_REPEAT: u32 = 8;
