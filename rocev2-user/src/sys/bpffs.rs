//! The BPF filesystem where maps are pinned so other processes (`rocev2
//! stats`) can open them while `rocev2 run` keeps the dataplane loaded.

use std::{ffi::CString, fs, os::unix::fs::DirBuilderExt as _, path::Path};

use anyhow::{bail, Context as _, Result};

const BPF_FS_MAGIC: i64 = 0xCAFE_4A11;
use crate::paths::BPFFS as DEFAULT_BPFFS;

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    rc == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

/// Makes sure `dir` can hold pins: mounts bpffs on /sys/fs/bpf when the
/// pin directory lives there and nothing is mounted (many minimal systems
/// and every `ip netns exec` shell lack it), then creates `dir` (mode 0700:
/// the maps steer traffic, only root may touch them).
pub fn prepare_pin_dir(dir: &Path) -> Result<()> {
    let parent = dir.parent().unwrap_or(Path::new("/"));
    if !is_bpffs(parent) {
        if parent == Path::new(DEFAULT_BPFFS) {
            let src = CString::new("bpf").expect("static");
            let target = CString::new(DEFAULT_BPFFS).expect("static");
            let opts = CString::new("mode=0700").expect("static");
            // SAFETY: valid C strings.
            let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), src.as_ptr(), 0, opts.as_ptr().cast()) };
            if rc != 0 {
                bail!(
                    "cannot mount the BPF filesystem on {DEFAULT_BPFFS}: {} (needs CAP_SYS_ADMIN)",
                    std::io::Error::last_os_error()
                );
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
            if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("link-")) {
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
