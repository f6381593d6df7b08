//! `rocev2 upgrade`: move a running `rocev2 run` onto this binary without
//! losing a packet, in one step.
//!
//! The running instance gets SIGUSR1 (handover: it exits, leaving its
//! programs attached through the links pinned in its pin directory, so the
//! dataplane keeps forwarding with the last config). Then the new binary
//! starts: under systemd by starting the unit the old process ran in (so
//! the service stays supervised), otherwise this process becomes the new
//! `rocev2 [--netns NAME] run --config FILE` itself. Either way the new run
//! loads fresh programs and swaps them into the pinned links atomically
//! (`took over <port> ...`).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::control::state::RunState;

/// How the new binary gets started after the handover.
#[derive(Debug, PartialEq, Eq)]
pub enum Restart {
    /// `systemctl start UNIT`.
    Systemd(String),
    /// Exec `rocev2 [--netns NAME] run --config FILE` in this process.
    InPlace,
}

/// The systemd unit (`rocev2*.service`) process `pid` runs in, from its cgroup.
pub fn systemd_unit_of(pid: u32) -> Option<String> {
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    unit_from_cgroup(&cgroup)
}

fn unit_from_cgroup(cgroup: &str) -> Option<String> {
    // cgroup v2: "0::/system.slice/rocev2.service"; v1: "1:name=systemd:/system.slice/rocev2.service".
    let line = cgroup
        .lines()
        .find(|l| l.starts_with("0::"))
        .or_else(|| cgroup.lines().find(|l| l.contains(":name=systemd:")))?;
    let path = line.rsplit(':').next()?;
    // Only rocev2's own units: a `rocev2 run` started by hand inside some
    // other service must not make us start that service.
    path.split('/').rfind(|c| c.starts_with("rocev2") && c.ends_with(".service")).map(str::to_string)
}

/// Hands the instance using `pin_dir` over and starts this binary in its
/// place. Returns only under systemd or on failure: otherwise this process
/// becomes the new `rocev2 run`.
pub fn upgrade(pin_dir: &Path, unit: Option<String>, timeout: Duration) -> Result<()> {
    let state = RunState::read(pin_dir)?;
    let pid = state.pid;
    if let Some(warning) = state.manager().warning(pin_dir) {
        bail!("nothing to upgrade: {warning}");
    }
    let restart = match unit.or_else(|| systemd_unit_of(pid)) {
        Some(unit) => Restart::Systemd(unit),
        None => Restart::InPlace,
    };
    let exe = std::env::current_exe().context("cannot find this binary")?;
    // Check the new binary before the old one stops.
    let version = Command::new(&exe).arg("--version").output().context("cannot run the new binary")?;
    if !version.status.success() {
        bail!("{} --version failed; not upgrading", exe.display());
    }
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();

    if let Err(e) = crate::sys::signal_process(pid, nix::sys::signal::Signal::SIGUSR1) {
        bail!("cannot signal rocev2 run (pid {pid}): {e}");
    }
    let deadline = Instant::now() + timeout;
    while crate::sys::process_alive(pid) {
        if Instant::now() > deadline {
            bail!("rocev2 run (pid {pid}) did not hand over within {} s", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("rocev2: pid {pid} handed over; the dataplane keeps forwarding until {version} takes over");

    match restart {
        Restart::Systemd(unit) => {
            let status = Command::new("systemctl").args(["start", &unit]).status().context("cannot run systemctl")?;
            if !status.success() {
                bail!(
                    "`systemctl start {unit}` failed ({status}); the dataplane still forwards with the old programs: see `journalctl -u {unit}`"
                );
            }
            println!("rocev2: started {unit}: {version} took over");
            Ok(())
        }
        Restart::InPlace => {
            use std::os::unix::process::CommandExt as _;
            let mut cmd = Command::new(&exe);
            if let Some(netns) = &state.netns {
                cmd.args(["--netns", netns]);
            }
            cmd.args(["run", "--config"]).arg(&state.config);
            println!("rocev2: starting {version}: {}", describe(&cmd));
            let err = cmd.exec();
            Err(err).context(format!("cannot start {}", exe.display()))
        }
    }
}

fn describe(cmd: &Command) -> String {
    std::iter::once(PathBuf::from(cmd.get_program()))
        .chain(cmd.get_args().map(PathBuf::from))
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unit_comes_from_the_cgroup() {
        assert_eq!(unit_from_cgroup("0::/system.slice/rocev2.service\n").as_deref(), Some("rocev2.service"));
        assert_eq!(
            unit_from_cgroup("12:cpu:/\n1:name=systemd:/system.slice/rocev2.service\n").as_deref(),
            Some("rocev2.service")
        );
        assert_eq!(unit_from_cgroup("0::/user.slice/user-0.slice/session-3.scope\n"), None);
        assert_eq!(unit_from_cgroup("0::/\n"), None);
        assert_eq!(unit_from_cgroup("0::/system.slice/other.service\n"), None);
    }
}
