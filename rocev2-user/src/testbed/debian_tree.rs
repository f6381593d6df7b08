//! Debian root trees built once from Debian packages and cached: a recipe
//! name gives a directory.
//!
//! A [`Recipe`] is what `debootstrap` installs (suite, variant, packages),
//! files to add, and a shell script run in the new tree (chrooted) to finish
//! it. [`ensure`] returns the tree for a recipe, building it the first time
//! under `CACHE/NAME-DIGEST/`, where DIGEST hashes everything in the recipe:
//! change the recipe and the next call builds a new tree (and removes the
//! older ones of that name). Concurrent callers wait for one build (a lock
//! file per name); a build that fails leaves nothing but its log.
//!
//! The trees are shared: use them read-only (a 9p root exported read-only,
//! an overlay, `systemd-nspawn --volatile`), never change them in place.

use std::{
    fmt::Write as _,
    fs,
    io::{ErrorKind, Read as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use sha2::{Digest as _, Sha256};

/// Where every tree comes from (debootstrap's default).
pub const MIRROR: &str = "http://deb.debian.org/debian";
/// The file a finished tree has at its top, holding the recipe it was built from.
const STAMP: &str = ".rocev2-tree";
/// A debootstrap that prints nothing for this long is stuck (a dead mirror).
const STALL: Duration = Duration::from_secs(300);

/// What a tree is made of; every field goes into its digest.
#[derive(Clone, Debug)]
pub struct Recipe {
    pub name: &'static str,
    /// Debian suite (`bookworm` is Debian 12).
    pub suite: &'static str,
    /// debootstrap's `--variant` (`minbase`: essential packages and apt).
    pub variant: &'static str,
    /// Installed on top (debootstrap `--include`), with their dependencies.
    pub packages: &'static [&'static str],
    /// Files written into the tree before `finish` runs: (path, mode, content).
    pub files: &'static [(&'static str, u32, &'static str)],
    /// A `/bin/sh -eu` script run in the tree (chroot) as root once the
    /// packages are installed.
    pub finish: &'static str,
}

/// The RDMA hosts of the lab (`lab up --rdma-hosts`): Debian's kernel,
/// Soft-RoCE's user space and the RDMA test tools, a small initramfs that
/// mounts a 9p root, and nothing a guest does not load (see
/// [`crate::testbed::guest`]).
pub const RDMA_GUEST: Recipe = Recipe {
    name: "rdma-guest",
    suite: "bookworm",
    variant: "minbase",
    packages: &[
        "linux-image-amd64",
        "kmod",
        "iproute2",
        "rdma-core",
        "ibverbs-providers",
        "ibverbs-utils",
        "perftest",
        "rdmacm-utils",
        // The initramfs: a static shell and cpio to pack it.
        "busybox-static",
        "cpio",
    ],
    files: &[
        ("usr/local/lib/rocev2-guest/initramfs-init", 0o755, include_str!("guest/initramfs-init.sh")),
        ("sbin/rocev2-guest-boot", 0o755, include_str!("guest/guest-boot.sh")),
    ],
    finish: include_str!("guest/rdma-guest-finish.sh"),
};

/// Debian 12 with systemd as it would boot on a server, for containers
/// (`systemd-nspawn -b -D TREE`).
pub const SYSTEMD: Recipe = Recipe {
    name: "systemd",
    suite: "bookworm",
    variant: "minbase",
    packages: &["systemd", "systemd-sysv", "dbus"],
    files: &[],
    finish: "",
};

/// Every recipe by name.
pub const RECIPES: &[&Recipe] = &[&RDMA_GUEST, &SYSTEMD];

/// The recipe called `name`; the error lists the known ones.
pub fn recipe(name: &str) -> Result<&'static Recipe> {
    RECIPES.iter().copied().find(|r| r.name == name).with_context(|| {
        let known: Vec<&str> = RECIPES.iter().map(|r| r.name).collect();
        format!("no tree recipe named {name:?}; there are: {}", known.join(", "))
    })
}

impl Recipe {
    /// The recipe as text: what the digest covers and the stamp records.
    pub fn text(&self) -> String {
        let mut t = format!(
            "rocev2 debian tree, format 1\nname {}\nsuite {}\nvariant {}\npackages {}\n",
            self.name,
            self.suite,
            self.variant,
            self.packages.join(",")
        );
        for (path, mode, content) in self.files {
            let _ = write!(t, "file {path} {mode:o} {} bytes\n{content}\n", content.len());
        }
        let _ = write!(t, "finish\n{}\n", self.finish);
        t
    }

    /// The first 16 hex digits of the SHA-256 of [`Recipe::text`].
    pub fn digest(&self) -> String {
        let hash = Sha256::digest(self.text().as_bytes());
        hash.iter().take(8).map(|b| format!("{b:02x}")).collect()
    }

    /// Where this recipe's tree is (or will be) in `cache`.
    pub fn path_in(&self, cache: &Path) -> PathBuf {
        cache.join(format!("{}-{}", self.name, self.digest()))
    }
}

/// The tree of `recipe` in `cache` if it is built (never builds).
pub fn built(recipe: &Recipe, cache: &Path) -> Option<PathBuf> {
    let path = recipe.path_in(cache);
    path.join(STAMP).exists().then_some(path)
}

/// A tree ready to use.
#[derive(Clone, Debug)]
pub struct Tree {
    pub path: PathBuf,
    /// Whether this call built it (and how long that took), or found it cached.
    pub built_in: Option<Duration>,
}

/// The tree of `recipe` under `cache`, built first if it is not there (as
/// root: debootstrap and chroot need it). Progress goes to
/// `CACHE/NAME-DIGEST.log`; a message on stderr says a build starts.
pub fn ensure(recipe: &Recipe, cache: &Path) -> Result<Tree> {
    if let Some(path) = built(recipe, cache) {
        return Ok(Tree { path, built_in: None });
    }
    let path = recipe.path_in(cache);
    fs::create_dir_all(cache).with_context(|| format!("cannot create {}", cache.display()))?;
    let lock_path = cache.join(format!("{}.lock", recipe.name));
    let lock_file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .with_context(|| format!("cannot open {}", lock_path.display()))?;
    // Waits while another process builds this recipe.
    let _lock = nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| anyhow::anyhow!("cannot lock {}: {e}", lock_path.display()))?;
    if path.join(STAMP).exists() {
        return Ok(Tree { path, built_in: None });
    }
    let started = Instant::now();
    let partial = cache.join(format!("{}-{}.partial", recipe.name, recipe.digest()));
    remove_tree(&partial)?;
    let log = cache.join(format!("{}-{}.log", recipe.name, recipe.digest()));
    eprintln!(
        "rocev2: building the {:?} Debian tree in {} (once; minutes, from deb.debian.org; log {})",
        recipe.name,
        path.display(),
        log.display()
    );
    if let Err(e) = build(recipe, &partial, &log) {
        let _ = remove_tree(&partial);
        return Err(e.context(format!("building the {:?} tree failed (log: {})", recipe.name, log.display())));
    }
    fs::write(partial.join(STAMP), recipe.text())?;
    fs::rename(&partial, &path)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), path.display()))?;
    remove_older(recipe, cache)?;
    Ok(Tree { path, built_in: Some(started.elapsed()) })
}

fn build(recipe: &Recipe, dir: &Path, log: &Path) -> Result<()> {
    let mut debootstrap = Command::new("debootstrap");
    debootstrap.arg(format!("--variant={}", recipe.variant));
    if !recipe.packages.is_empty() {
        debootstrap.arg(format!("--include={}", recipe.packages.join(",")));
    }
    debootstrap.arg(recipe.suite).arg(dir).arg(MIRROR);
    run_logged(&mut debootstrap, log, "debootstrap (apt-get install debootstrap, or `cargo xtask setup`)")?;
    for (rel, mode, content) in recipe.files {
        let file = dir.join(rel);
        if let Some(parent) = file.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&file, content).with_context(|| format!("cannot write {}", file.display()))?;
        fs::set_permissions(&file, fs::Permissions::from_mode(*mode))?;
    }
    if !recipe.finish.is_empty() {
        let mut finish = Command::new("chroot");
        finish.arg(dir).args(["/bin/sh", "-euc", recipe.finish, "finish"]);
        finish.env_clear().env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").env("LC_ALL", "C");
        run_logged(&mut finish, log, "chroot")?;
    }
    Ok(())
}

/// Runs `cmd` with stdout and stderr appended to `log`; fails if it fails
/// or if the log stops growing for [`STALL`] (progress, not wall time).
fn run_logged(cmd: &mut Command, log: &Path, what: &str) -> Result<()> {
    let file = fs::OpenOptions::new().create(true).append(true).open(log)?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| format!("cannot start {what}"))?;
    let mut last = (0, Instant::now());
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                bail!("{cmd:?} failed ({status}); its last lines:\n{}", tail(log, 15));
            }
            return Ok(());
        }
        let size = fs::metadata(log).map(|m| m.len()).unwrap_or(0);
        if size != last.0 {
            last = (size, Instant::now());
        } else if last.1.elapsed() > STALL {
            let _ = child.kill();
            let _ = child.wait();
            bail!("{cmd:?} printed nothing for {STALL:?}; its last lines:\n{}", tail(log, 15));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The last `n` lines of a text file.
pub fn tail(path: &Path, n: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Removes the other trees of `recipe`'s name (older recipes) and their logs.
fn remove_older(recipe: &Recipe, cache: &Path) -> Result<()> {
    let current = format!("{}-{}", recipe.name, recipe.digest());
    for entry in fs::read_dir(cache)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(&format!("{}-", recipe.name)) else { continue };
        // NAME-<16 hex>[.partial|.log]: another recipe's name may share the prefix.
        let digest = rest.split('.').next().unwrap_or("");
        if digest.len() != 16 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) || name.starts_with(&current) {
            continue;
        }
        let old = cache.join(&name);
        if old.is_dir() {
            remove_tree(&old)?;
        } else {
            let _ = fs::remove_file(&old);
        }
    }
    Ok(())
}

/// Removes a tree, first unmounting anything mounted below it (a failed
/// debootstrap can leave its /proc and /sys mounted, and removing through
/// them would reach the host's).
fn remove_tree(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let canonical = dir.canonicalize()?;
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut below: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| Path::new(m).starts_with(&canonical))
        .collect();
    // Deepest first.
    below.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in below {
        nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH)
            .with_context(|| format!("cannot unmount {m} (below {})", dir.display()))?;
    }
    match fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot remove {}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debian_tree_digest_follows_every_field() {
        let base = RDMA_GUEST.clone();
        let digest = base.digest();
        assert_eq!(digest.len(), 16);
        assert_eq!(digest, RDMA_GUEST.digest(), "the digest is a function of the recipe");
        let variants = [
            Recipe { suite: "trixie", ..base.clone() },
            Recipe { variant: "buildd", ..base.clone() },
            Recipe { packages: &["kmod"], ..base.clone() },
            Recipe { files: &[("etc/x", 0o644, "x")], ..base.clone() },
            Recipe { finish: "true", ..base.clone() },
        ];
        for v in variants {
            assert_ne!(v.digest(), digest, "{v:?}");
        }
        assert_ne!(SYSTEMD.digest(), digest);
        let path = RDMA_GUEST.path_in(Path::new("/c"));
        assert_eq!(path, PathBuf::from(format!("/c/rdma-guest-{digest}")));
    }

    #[test]
    fn debian_tree_recipes_by_name() {
        assert_eq!(recipe("systemd").unwrap().packages, ["systemd", "systemd-sysv", "dbus"]);
        let e = recipe("rdma").unwrap_err().to_string();
        assert!(e.contains("rdma-guest, systemd"), "{e}");
    }

    #[test]
    fn debian_tree_older_trees_of_a_name_only_are_removed() {
        let cache = std::env::temp_dir().join(format!("rocev2-tree-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        fs::create_dir_all(&cache).unwrap();
        let current = format!("rdma-guest-{}", RDMA_GUEST.digest());
        let keep =
            [current.as_str(), "rdma-guest.lock", "rdma-guest-extra-0123456789abcdef", "systemd-0123456789abcdef"];
        let gone = ["rdma-guest-0123456789abcdef", "rdma-guest-0123456789abcdef.log"];
        for name in keep.iter().chain(&gone) {
            if name.ends_with(".log") || name.ends_with(".lock") {
                fs::write(cache.join(name), "").unwrap();
            } else {
                fs::create_dir_all(cache.join(name).join("etc")).unwrap();
            }
        }
        remove_older(&RDMA_GUEST, &cache).unwrap();
        for name in keep {
            assert!(cache.join(name).exists(), "{name} was removed");
        }
        for name in gone {
            assert!(!cache.join(name).exists(), "{name} is still there");
        }
        fs::remove_dir_all(&cache).unwrap();
    }
}
