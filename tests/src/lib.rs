//! Shared harness for rocev2's privileged integration tests.
//!
//! These tests load real eBPF programs and build network namespaces, so
//! they need root. They never skip silently: without root they fail and
//! say why.

pub mod book;
pub mod fixture;
pub mod package;
pub mod rdma;

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use aya::{TestRun as _, TestRunOptions};
use rocev2_user::control::dataplane::{Dataplane, XDP_PROGRAM};

/// Fails the test (with the reason) unless we can load BPF programs.
pub fn require_root() {
    // SAFETY: no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test loads XDP programs and creates network namespaces: run it as root (`sudo cargo xtask test`)"
    );
}

/// The `rocev2` binary the netns tests start (`cargo xtask test` builds it
/// and sets ROCEV2_BIN).
pub fn rocev2_bin() -> PathBuf {
    let path = std::env::var_os("ROCEV2_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/rocev2"));
    assert!(
        path.exists(),
        "{} does not exist: build it first (`cargo xtask test` does) or set ROCEV2_BIN",
        path.display()
    );
    path
}

/// A directory removed, with everything in it, when the guard drops: at
/// the end of the test, and when it fails.
pub struct RemoveOnDrop(pub PathBuf);

impl RemoveOnDrop {
    /// A fresh, empty scratch directory `/tmp/rocev2-<what>-<pid>`.
    pub fn scratch(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("rocev2-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The result of one BPF_PROG_TEST_RUN.
#[derive(Debug)]
pub struct Run {
    pub action: u32,
    pub output: Vec<u8>,
}

/// Runs the forwarding program once on `frame`. In a test run the ingress
/// interface is the loopback device (ifindex 1).
pub fn test_run(dataplane: &mut Dataplane, frame: &[u8]) -> Result<Run> {
    run_program(dataplane.xdp_program(XDP_PROGRAM)?, frame)
}

/// Runs the host bridge program (`rocev2_bridge`) once on `frame`, loading
/// it first if needed; the ingress interface is lo, as for [`test_run`].
pub fn test_run_bridge(dataplane: &mut Dataplane, frame: &[u8]) -> Result<Run> {
    run_program(dataplane.bridge_program()?, frame)
}

fn run_program(program: &mut aya::programs::Xdp, frame: &[u8]) -> Result<Run> {
    let mut output = vec![0u8; frame.len() + 4096];
    let result = program
        .test_run(TestRunOptions { data_in: Some(frame), data_out: Some(&mut output), ..Default::default() })
        .context("BPF_PROG_TEST_RUN failed")?;
    output.truncate(result.data_size_out as usize);
    Ok(Run { action: result.return_value, output })
}

pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_REDIRECT: u32 = 4;

pub fn action_name(action: u32) -> &'static str {
    match action {
        XDP_ABORTED => "XDP_ABORTED",
        XDP_DROP => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        3 => "XDP_TX",
        XDP_REDIRECT => "XDP_REDIRECT",
        _ => "unknown",
    }
}

/// Takes down the persistent lab `name` (`rocev2 lab up --name NAME`) when
/// the test ends, also on panic; a lab already down is left alone.
pub struct LabGuard(pub String);

impl Drop for LabGuard {
    fn drop(&mut self) {
        if rocev2_user::testbed::lab::record_path(&self.0).exists() {
            if let Err(e) = rocev2_user::testbed::lab::down(&self.0) {
                eprintln!("warning: lab down {}: {e:#}", self.0);
            }
        }
    }
}

/// Fails if a namespace of lab `name` (`NAME-...`) is left. Matched by
/// prefix, not substring: lab `t1` must not see lab `ft1`'s namespaces.
pub fn assert_lab_namespaces_gone(name: &str) {
    let left = rocev2_user::sys::netns::ip(&["netns", "list"]).expect("ip netns list");
    let prefix = format!("{name}-");
    let ours: Vec<&str> = left.lines().filter(|l| l.starts_with(&prefix)).collect();
    assert!(ours.is_empty(), "namespaces of lab {name} left: {ours:?}");
}

/// Fails if the switch lost a frame (sent, never arrived: counted by the
/// arrival probes where the frames land); a capture that dropped frames
/// is reported as the observer's loss, not failed. Prints a MEASURED line.
pub fn assert_no_switch_loss(report: &rocev2_user::testbed::ecmp_lab::LabReport, what: &str) {
    let loss = report.loss();
    println!("MEASURED: {}: {}", what.lines().next().unwrap_or(what), loss.describe());
    if let Err(why) = loss.check() {
        panic!("{what}: {why}\n{}", report.render());
    }
}
