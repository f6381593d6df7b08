//! Labs: the real `rocev2` binary against the real kernel, in network
//! namespaces each test makes for itself (veths, FRR, systemd's notify
//! socket, perf), plus the package build. Root; most tests take seconds
//! to a minute. Tests run two at a time (`cargo xtask test` passes
//! `--test-threads=2`), so none may depend on having the machine alone:
//! those go to the `exclusive` binary.
//!
//! One binary for all of them, a module per area (as aya's integration
//! tests are); the shared harness is the `rocev2_tests` library in
//! `tests/src`.

mod collective;
mod collective_model;
mod cpu_spread;
mod demo;
mod ecmp;
mod fabric;
mod fabric_tutorial;
mod first_hour;
mod gen_sink;
mod host_bridge;
mod host_bridge_tutorial;
mod kernel_routes;
mod lab_command;
mod loss_accounting;
mod metrics;
mod packaging;
mod profile;
mod qos;
mod rc_telemetry;
mod rdma_guests;
mod reliability;
mod service;
mod shown_configs;
mod soak;
mod sys;
mod takeover;
mod transport_aware;
mod tutorial;
mod under_systemd;
