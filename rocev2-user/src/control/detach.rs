//! `rocev2 detach`: removes what a `rocev2 run` that is gone left behind
//! (`kill -9`, a crash, a handover no new run took), as `xdp-loader
//! unload` does for xdp-tools: the XDP links pinned in its pin directory
//! (which detaches the programs), its maps, its state file and lock.
//!
//! A live run is never touched: its lock is taken first, and stopping a
//! live run is its own business (`systemctl stop`, SIGTERM), which detaches
//! and prints the final counters too.

use std::{fs, path::Path};

use anyhow::{bail, Context as _, Result};

use crate::{
    control::dataplane::Maps,
    control::state::{Manager, RunLock, RunState},
    control::stats::Snapshot,
    sys::paths::LINK_PIN_PREFIX,
};

/// What `detach` removed.
pub struct Detached {
    /// Ports whose XDP program was detached.
    pub ports: Vec<String>,
    /// The counters just before, when the maps and state could be read.
    pub counters: Option<Snapshot>,
}

pub fn detach(pin_dir: &Path) -> Result<Detached> {
    let state = RunState::read(pin_dir).ok();
    if let Some(Manager::Running(pid)) = state.as_ref().map(RunState::manager) {
        bail!(
            "`rocev2 run` pid {pid} manages the dataplane in {}: stop it instead (`systemctl stop rocev2` for the service, else `kill {pid}`); a stop detaches and prints the final counters",
            pin_dir.display()
        );
    }
    if !pin_dir.exists() {
        if state.is_some() {
            RunState::remove(pin_dir);
        }
        let stale = if state.is_some() { " (a stale state file was removed)" } else { "" };
        bail!("nothing to detach: {} does not exist{stale}{}", pin_dir.display(), elsewhere(pin_dir));
    }
    // Fails while a live run holds it, which the check above should have caught.
    let _lock = RunLock::acquire(pin_dir)?;
    // Without the "nobody manages this ... `rocev2 detach` removes it"
    // warning the counters of an unmanaged dataplane carry: this is that
    // detach.
    let counters = state.as_ref().and_then(|s| Snapshot::collect(&Maps::open_pinned(pin_dir).ok()?, s).ok()).map(
        |mut snapshot| {
            snapshot.unmanaged = None;
            snapshot
        },
    );
    let mut ports = Vec::new();
    let entries = fs::read_dir(pin_dir).with_context(|| format!("cannot read {}", pin_dir.display()))?;
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    // Links first: the programs stop forwarding before their maps go; by
    // name, so the ports are reported in order (not directory order).
    paths.sort_by(|a, b| (!is_link_pin(a), a).cmp(&(!is_link_pin(b), b)));
    for path in paths {
        fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
        if is_link_pin(&path) {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            ports.push(name.trim_start_matches(LINK_PIN_PREFIX).to_string());
        }
    }
    fs::remove_dir(pin_dir).with_context(|| format!("cannot remove {}", pin_dir.display()))?;
    RunState::remove(pin_dir);
    Ok(Detached { ports, counters })
}

/// After "nothing to detach" in `pin_dir`: the dataplanes pinned
/// elsewhere, those a gone run left first (what `detach --pin-dir` removes),
/// then those a live run manages (stopping that run detaches them), or that
/// there are none. Someone removing things is not told to start a run.
fn elsewhere(pin_dir: &Path) -> String {
    let (mut left, mut managed) = (Vec::new(), Vec::new());
    for s in crate::control::state::instances().into_iter().filter(|s| s.pin_dir != pin_dir) {
        match s.manager() {
            Manager::Running(_) => managed.push(s.listing_line("")),
            Manager::Nobody { since, handed_over, .. } => {
                let how = if handed_over { "handed over" } else { "gone" };
                let since =
                    since.map(|t| format!(" since {}", crate::control::state::clock_time(t))).unwrap_or_default();
                left.push(s.listing_line(&format!(" {how}{since}")));
            }
        }
    }
    if left.is_empty() && managed.is_empty() {
        return "; no other dataplane is pinned either (nothing is left attached)".to_string();
    }
    // One heading, so the lists read as the other pin directories, not as
    // more about the one that does not exist.
    let mut text = "; the dataplanes pinned elsewhere:".to_string();
    if !left.is_empty() {
        text.push_str("\nleft by a run that is gone (remove one with `rocev2 detach --pin-dir DIR`):");
        text.push_str(&left.concat());
    }
    if !managed.is_empty() {
        text.push_str("\nmanaged by a live `rocev2 run` (stopping that run detaches it):");
        text.push_str(&managed.concat());
    }
    text
}

fn is_link_pin(path: &Path) -> bool {
    path.file_name().is_some_and(|n| n.to_string_lossy().starts_with(LINK_PIN_PREFIX))
}
