//! The one privilege check: every subcommand that needs privileges asks
//! [`require`] first, so a missing capability is named with how to grant
//! it, instead of a bare EPERM/EACCES from the kernel, or a misleading hint,
//! reaching the user.

use std::{io::ErrorKind, os::unix::fs::MetadataExt as _, path::Path};

use anyhow::{bail, Result};

const CAP_DAC_OVERRIDE: u32 = 1;
const CAP_NET_RAW: u32 = 13;
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// What a subcommand is about to do that needs privileges.
#[derive(Debug, Clone, Copy)]
pub enum Need<'a> {
    /// Load and attach XDP programs (`run`, `bench`, `fault`, `gen --mode
    /// live-frames`): CAP_BPF and CAP_NET_ADMIN, and CAP_PERFMON, without
    /// which the verifier refuses the programs' pointer arithmetic ("pointer
    /// arithmetic with it prohibited for !root"). CAP_SYS_ADMIN stands in
    /// for CAP_BPF and CAP_PERFMON.
    LoadXdp,
    /// Open the maps pinned in this directory (`stats`, `reload`, `explain`
    /// against a live dataplane): the directory is root's, mode 0700.
    PinnedMaps(&'a Path),
    /// Create, enter or remove network namespaces and write under /run
    /// (`lab up`/`down`, `demo`, `--netns`).
    Namespaces,
    /// Enter existing namespaces and read the state under /run/rocev2
    /// (`lab status`, `lab stats`): reading, not making.
    InspectNamespaces,
    /// Enter an existing network namespace (`--netns NAME`).
    EnterNamespace,
    /// Send or receive raw frames (AF_PACKET: `gen`, `sink`).
    RawSockets,
}

/// Effective capability set of this process, from /proc/self/status.
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The capabilities `need` calls for that the process lacks, by name.
fn missing(need: Need<'_>, caps: u64) -> Vec<&'static str> {
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    let mut missing = Vec::new();
    match need {
        Need::LoadXdp => {
            // CAP_SYS_ADMIN implies CAP_BPF.
            if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
                missing.push("CAP_BPF");
            }
            if !has(CAP_NET_ADMIN) {
                missing.push("CAP_NET_ADMIN");
            }
            if !has(CAP_PERFMON) && !has(CAP_SYS_ADMIN) {
                missing.push("CAP_PERFMON");
            }
        }
        Need::PinnedMaps(dir) => {
            if !has(CAP_DAC_OVERRIDE) && !owns_path(dir) {
                missing.push("CAP_DAC_OVERRIDE");
            }
        }
        Need::Namespaces => {
            if !has(CAP_SYS_ADMIN) {
                missing.push("CAP_SYS_ADMIN");
            }
            if !has(CAP_NET_ADMIN) {
                missing.push("CAP_NET_ADMIN");
            }
            if !has(CAP_DAC_OVERRIDE) && euid() != 0 {
                missing.push("CAP_DAC_OVERRIDE");
            }
        }
        Need::InspectNamespaces => {
            if !has(CAP_SYS_ADMIN) {
                missing.push("CAP_SYS_ADMIN");
            }
            if !has(CAP_DAC_OVERRIDE) && euid() != 0 {
                missing.push("CAP_DAC_OVERRIDE");
            }
        }
        Need::EnterNamespace => {
            if !has(CAP_SYS_ADMIN) {
                missing.push("CAP_SYS_ADMIN");
            }
        }
        Need::RawSockets => {
            if !has(CAP_NET_RAW) {
                missing.push("CAP_NET_RAW");
            }
        }
    }
    missing
}

/// Whether this process can reach `dir` without overriding permissions: it
/// does not exist (the caller then says what is missing), or it and every
/// directory above it let us in.
fn owns_path(dir: &Path) -> bool {
    match std::fs::metadata(dir) {
        Ok(m) => m.uid() == euid() || m.mode() & 0o005 == 0o005,
        Err(e) => e.kind() != ErrorKind::PermissionDenied,
    }
}

fn what(need: Need<'_>) -> String {
    match need {
        Need::LoadXdp => "to load and attach XDP programs".to_string(),
        Need::PinnedMaps(dir) => {
            format!("to open the maps pinned in {} (root's, mode 0700)", dir.display())
        }
        Need::Namespaces => {
            "to create, enter and remove network namespaces (under /run/netns and /run/rocev2)".to_string()
        }
        Need::InspectNamespaces => {
            "to enter the lab's network namespaces and read its state under /run/rocev2".to_string()
        }
        Need::EnterNamespace => "to enter a network namespace".to_string(),
        Need::RawSockets => "to send and receive raw frames (AF_PACKET)".to_string(),
    }
}

/// Fails, naming what is missing and how to grant it, unless this process
/// may do `need`. `command` is the subcommand as typed (e.g. `stats`).
pub fn require(command: &str, need: Need<'_>) -> Result<()> {
    let Some(caps) = effective_caps() else {
        return Ok(()); // cannot tell; let the kernel answer
    };
    let missing = missing(need, caps);
    if missing.is_empty() {
        return Ok(());
    }
    // setcap replaces the file's whole set: name every capability `need`
    // calls for, not only the missing ones.
    let setcap = self::missing(need, 0).iter().map(|c| c.to_lowercase()).collect::<Vec<_>>().join(",");
    let typed = if command.is_empty() { "rocev2".to_string() } else { format!("rocev2 {command}") };
    bail!(
        "`{typed}` needs {} {} (effective capabilities of this process: {caps:#x}); run it as root (`sudo {typed} …`) or grant them, e.g. `sudo setcap {setcap}+ep $(which rocev2)`",
        missing.join(" and "),
        what(need),
    );
}

/// Loading and attaching XDP needs CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON
/// (CAP_SYS_ADMIN implies the first and the last).
pub fn check() -> Result<()> {
    require("", Need::LoadXdp)
}

/// Whether this process has CAP_PERFMON (or CAP_SYS_ADMIN, which implies
/// it); true when that cannot be told.
pub fn has_perfmon() -> bool {
    effective_caps().is_none_or(|caps| caps & (1 << CAP_PERFMON | 1 << CAP_SYS_ADMIN) != 0)
}

/// Whether an error chain is a permission error from the kernel (EACCES,
/// EPERM), so that callers can tell it apart from "not there".
pub fn is_permission_error(error: &anyhow::Error) -> bool {
    error.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == ErrorKind::PermissionDenied || io.raw_os_error() == Some(libc::EPERM))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_need_names_its_capabilities() {
        assert_eq!(missing(Need::LoadXdp, 0), ["CAP_BPF", "CAP_NET_ADMIN", "CAP_PERFMON"]);
        assert!(missing(Need::LoadXdp, 1 << CAP_SYS_ADMIN | 1 << CAP_NET_ADMIN).is_empty());
        // What the systemd unit grants, and the walk's setcap line without perfmon.
        assert!(missing(Need::LoadXdp, 1 << CAP_BPF | 1 << CAP_NET_ADMIN | 1 << CAP_PERFMON).is_empty());
        assert_eq!(missing(Need::LoadXdp, 1 << CAP_BPF | 1 << CAP_NET_ADMIN), ["CAP_PERFMON"]);
        assert_eq!(missing(Need::RawSockets, 0), ["CAP_NET_RAW"]);
        assert!(missing(Need::RawSockets, 1 << CAP_NET_RAW).is_empty());
        let all = u64::MAX;
        assert!(missing(Need::Namespaces, all).is_empty());
        assert!(missing(Need::PinnedMaps(Path::new("/nonexistent/rocev2")), all).is_empty());
    }
}
