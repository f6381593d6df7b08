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
//! Every module is also re-exported at the crate root (`rocev2_user::config`,
//! `rocev2_user::lab`, ...), the paths the rest of the code uses.

pub mod control;
pub mod render;
pub mod sys;
pub mod testbed;
pub mod tools;

pub use control::{
    capacity, collisions, config, dataplane, errors, health, members, metrics, notify, qp_telemetry, routing, run,
    state, stats, top, trace, upgrade, watch,
};
pub use sys::{bpffs, netlink, netns, paths, privileges, rawsock, signals};
pub use testbed::{bench, fault, frr, lab, labcmd, topology};
pub use tools::{entropy, explain, fabric, gen, packet, programs, rc, sink};

/// The compiled forwarding object, what `rocev2 run` loads (empty when
/// built with `AYA_BUILD_SKIP=1`).
pub const EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rocev2"));
/// The tools' object: the generator's, fault injector's and benchmark's
/// programs with their own maps (see tools/programs.rs).
pub const TOOLS_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rocev2-tools"));
