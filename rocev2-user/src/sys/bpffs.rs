//! The BPF filesystem where maps are pinned so other processes (`rocev2
//! stats`) can open them while `rocev2 run` keeps the dataplane loaded.

use std::{
    fs,
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _},
    path::Path,
};

use anyhow::{bail, Context as _, Result};

use crate::sys::paths::BPFFS as DEFAULT_BPFFS;

fn is_bpffs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|st| st.filesystem_type() == nix::sys::statfs::BPF_FS_MAGIC)
}

/// Makes sure `dir` can hold pins: mounts bpffs on /sys/fs/bpf when the
/// pin directory lives there and nothing is mounted (many minimal systems
/// and every `ip netns exec` shell lack it), then creates `dir` (mode 0700:
/// the maps steer traffic, only root may touch them). Pins in it from an
/// earlier run are removed, but for XDP links and those named in `keep`.
pub fn prepare_pin_dir(dir: &Path, keep: &[&str]) -> Result<()> {
    let parent = dir.parent().unwrap_or(Path::new("/"));
    if !is_bpffs(parent) {
        if parent == Path::new(DEFAULT_BPFFS) {
            let flags = nix::mount::MsFlags::empty();
            if let Err(e) = nix::mount::mount(Some("bpf"), DEFAULT_BPFFS, Some("bpf"), flags, Some("mode=0700")) {
                bail!("cannot mount the BPF filesystem on {DEFAULT_BPFFS}: {e} (needs CAP_SYS_ADMIN)");
            }
        } else {
            bail!(
                "pin_dir {}: its parent is not a BPF filesystem; mount one with `mount -t bpf bpf {}` or use a pin_dir under {DEFAULT_BPFFS}",
                dir.display(),
                parent.display()
            );
        }
    }
    if dir.exists() {
        // Map pins left by a run that handed over or did not exit cleanly
        // (the run lock guarantees no live instance uses them). XDP link
        // pins stay: the new run swaps its program into them.
        for entry in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
            let path = entry?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if name.starts_with(crate::sys::paths::LINK_PIN_PREFIX) || keep.contains(&name.as_str()) {
                continue;
            }
            fs::remove_file(&path).with_context(|| format!("cannot remove stale pin {}", path.display()))?;
        }
    } else {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create pin directory {}", dir.display()))?;
    }
    Ok(())
}

/// Whether this process sees another /sys/fs/bpf than the rest of the
/// system: true under `ip netns exec`, which runs the command in a private
/// mount namespace with a fresh /sys, so whatever it pins there is
/// invisible to every other process and gone with it. "The rest" is PID 1
/// (the init of this host or container), or where /proc/1 is out of
/// reach, the parent process (the shell that ran `ip netns exec`). A
/// systemd service in its own mount namespace sees the host's bpffs bound
/// in, the same filesystem: not private. False when it cannot be told.
pub fn private_view() -> bool {
    let ppid = nix::unistd::getppid().as_raw().to_string();
    let other = ["1", ppid.as_str()].into_iter().find(|pid| fs::metadata(format!("/proc/{pid}/ns/mnt")).is_ok());
    let Some(other) = other else { return false };
    let mount_ns = |pid: &str| fs::metadata(format!("/proc/{pid}/ns/mnt")).ok().map(|m| m.ino());
    if mount_ns("self") == mount_ns(other) {
        return false;
    }
    let dev = |path: &str| fs::metadata(path).ok().map(|m| m.dev());
    match (dev(DEFAULT_BPFFS), dev(&format!("/proc/{other}/root{DEFAULT_BPFFS}"))) {
        (Some(ours), Some(theirs)) => ours != theirs,
        // /sys/fs/bpf does not even exist here, while it does there.
        (None, Some(_)) => true,
        _ => false,
    }
}

/// What a [`private_view`] is, for messages.
pub const PRIVATE_VIEW: &str = "this process sees its own /sys/fs/bpf, not the host's (it runs in a private mount namespace with a fresh /sys, as `ip netns exec` makes)";
