//! Says exactly which capability is missing instead of letting a bare
//! EPERM from the bpf() syscall reach the user.

use anyhow::{bail, Result};

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// Effective capability set of this process, from /proc/self/status.
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?.trim();
    u64::from_str_radix(hex, 16).ok()
}

/// Loading and attaching XDP needs CAP_BPF (or CAP_SYS_ADMIN, which
/// implies it) and CAP_NET_ADMIN.
pub fn check() -> Result<()> {
    let Some(caps) = effective_caps() else {
        return Ok(()); // cannot tell; let the kernel answer
    };
    let has = |cap: u32| caps & (1u64 << cap) != 0;
    let mut missing = Vec::new();
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    if !missing.is_empty() {
        bail!(
            "rocev2 needs {} to load and attach XDP programs (effective capabilities are {caps:#x}); run it as root or grant them, e.g. `sudo setcap cap_bpf,cap_net_admin,cap_sys_admin+ep $(which rocev2)`",
            missing.join(" and ")
        );
    }
    Ok(())
}
