//! What a running `rocev2 run` publishes about itself beside its pinned
//! maps: port and member names for `rocev2 stats`, and a lock so two
//! instances never share one pin directory.

use std::{
    fs,
    io::Write as _,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

const RUN_DIR: &str = "/run/rocev2";

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunState {
    pub pid: u32,
    pub config: PathBuf,
    pub netns: Option<String>,
    pub ports: Vec<PortState>,
    pub groups: Vec<GroupState>,
    /// `[[egress]]` ports with a virtual queue, by counter slot.
    #[serde(default)]
    pub egress: Vec<EgressState>,
    /// Class names in CLASSES order.
    #[serde(default)]
    pub classes: Vec<String>,
    /// Reloads (SIGHUP) handled so far, and how the last one went ("ok" or
    /// the error), for `rocev2 reload` to report.
    #[serde(default)]
    pub reloads: u64,
    #[serde(default)]
    pub last_reload: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EgressState {
    pub name: String,
    pub slot: u32,
    pub rate_bytes_per_sec: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PortState {
    pub name: String,
    pub ifindex: u32,
    pub slot: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupState {
    pub name: String,
    pub index: u32,
    pub hash: String,
    /// Members in position order, as live in the dataplane.
    pub members: Vec<MemberState>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberState {
    pub dev: String,
    pub next_hop: String,
    pub mac: String,
}

/// File names under /run/rocev2 derived from the pin directory, so each
/// dataplane instance has its own.
fn run_file(pin_dir: &Path, ext: &str) -> PathBuf {
    let flat: String = pin_dir
        .to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    Path::new(RUN_DIR).join(format!("{flat}.{ext}"))
}

pub fn state_path(pin_dir: &Path) -> PathBuf {
    run_file(pin_dir, "json")
}

impl RunState {
    pub fn write(&self, pin_dir: &Path) -> Result<()> {
        let path = state_path(pin_dir);
        fs::create_dir_all(RUN_DIR).with_context(|| format!("cannot create {RUN_DIR}"))?;
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(self)?).with_context(|| format!("cannot write {}", tmp.display()))?;
        fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
    }

    pub fn read(pin_dir: &Path) -> Result<Self> {
        let path = state_path(pin_dir);
        let text = fs::read(&path).map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                "permission denied: run it as root".to_string()
            } else {
                format!("is `rocev2 run` running with pin_dir {}?", pin_dir.display())
            };
            anyhow::Error::new(e).context(format!("cannot read {} ({hint})", path.display()))
        })?;
        serde_json::from_slice(&text).with_context(|| format!("{} is not valid rocev2 state", path.display()))
    }

    pub fn remove(pin_dir: &Path) {
        let _ = fs::remove_file(state_path(pin_dir));
    }
}

/// An exclusive lock on a pin directory, held for the life of `rocev2 run`.
pub struct RunLock {
    _file: fs::File,
    path: PathBuf,
}

impl RunLock {
    pub fn acquire(pin_dir: &Path) -> Result<Self> {
        fs::create_dir_all(RUN_DIR).with_context(|| format!("cannot create {RUN_DIR}"))?;
        let path = run_file(pin_dir, "lock");
        let mut file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open lock file {}", path.display()))?;
        // SAFETY: valid fd.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let holder = fs::read_to_string(&path).unwrap_or_default();
            bail!(
                "another `rocev2 run` (pid {}) already uses pin_dir {}; stop it or set a different [dataplane] pin_dir",
                holder.trim(),
                pin_dir.display()
            );
        }
        file.set_len(0)?;
        write!(file, "{}", std::process::id())?;
        Ok(Self { _file: file, path })
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}
