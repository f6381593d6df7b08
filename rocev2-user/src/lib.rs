//! rocev2 control program as a library: the `rocev2` binary is a thin CLI
//! over these modules, and the integration tests use them directly.

pub mod bench;
pub mod bpffs;
pub mod capacity;
pub mod config;
pub mod dataplane;
pub mod entropy;
pub mod explain;
pub mod frr;
pub mod gen;
pub mod lab;
pub mod labcmd;
pub mod metrics;
pub mod netlink;
pub mod netns;
pub mod notify;
pub mod packet;
pub mod privileges;
pub mod rawsock;
pub mod routing;
pub mod run;
pub mod sink;
pub mod state;
pub mod stats;
pub mod upgrade;
pub mod watch;

/// The compiled eBPF object (empty when built with `AYA_BUILD_SKIP=1`).
pub const EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rocev2"));
