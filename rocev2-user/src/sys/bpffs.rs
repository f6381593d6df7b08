//! The BPF filesystem where maps are pinned so other processes (`rocev2
//! stats`) can open them while `rocev2 run` keeps the dataplane loaded.

use std::{fs, os::unix::fs::DirBuilderExt as _, path::Path};

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
            if name.starts_with("link-") || keep.contains(&name.as_str()) {
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
