//! rocev2 control program as a library: the `rocev2` binary is a thin CLI
//! over these modules, and the integration tests use them directly.
//!
//! Laid out by role, each layer using only the ones below it:
//! - [`testbed`]: labs of network namespaces, FRR, the benchmark;
//! - [`tools`]: traffic and teaching tools (gen, sink, frames, entropy, explain);
//! - [`control`]: the control plane: config, the dataplane's maps, the
//!   daemon (`run`), routes from the kernel, observation (stats, metrics);
//! - [`sys`]: system interfaces: netlink, namespaces, bpffs, privileges,
//!   raw sockets.
//!
//! Code names a module by its layer (`crate::control::config`,
//! `rocev2_user::sys::netns`): there are no crate-root re-exports, so the
//! layering can be read from every `use`.

pub mod control;
pub mod render;
pub mod sys;
pub mod testbed;
pub mod tools;

/// The compiled forwarding object, what `rocev2 run` loads (empty when
/// built with `AYA_BUILD_SKIP=1`).
pub const EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rocev2"));
/// The tools' object: the generator's, fault injector's and benchmark's
/// programs with their own maps (see tools/programs.rs).
pub const TOOLS_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rocev2-tools"));
