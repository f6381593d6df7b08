//! The control plane: the config file, the dataplane's maps and their
//! encoding, the daemon loop (`rocev2 run`), routes learned from the kernel,
//! and what an operator observes (stats, watch, metrics, the state file).

pub mod bridge;
pub mod capacity;
pub mod collisions;
pub mod config;
pub mod dataplane;
pub mod decision;
pub mod detach;
pub mod errors;
pub mod groups;
pub mod health;
pub mod members;
pub mod metrics;
pub mod notify;
pub mod qp_telemetry;
pub mod routing;
pub mod run;
pub mod state;
pub mod stats;
pub mod top;
pub mod trace;
pub mod upgrade;
pub mod watch;
