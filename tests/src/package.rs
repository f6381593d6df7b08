//! The Debian package as `cargo xtask package --debug` builds it, built
//! once per test process: the package test and the systemd test both need
//! it, and each build (cargo-deb, lintian) takes the better part of a
//! minute.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::OnceLock,
};

use crate::rocev2_bin;

/// One `cargo xtask package --debug` run.
pub struct DebugPackage {
    /// The .deb it wrote.
    pub deb: PathBuf,
    /// What it printed (stdout, then stderr): the lintian report is in it.
    pub log: String,
}

/// The package, built on the first call; later calls (from any thread)
/// wait for that build and share it. Do not modify the file: copy it.
pub fn debug_package() -> &'static DebugPackage {
    static BUILT: OnceLock<DebugPackage> = OnceLock::new();
    BUILT.get_or_init(build)
}

fn build() -> DebugPackage {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ lives in the workspace");
    // Beside the binary it packages (target/debug), not in /tmp: the build
    // output belongs to the build directory and is replaced by the next run.
    let dir = rocev2_bin().parent().expect("the binary has a directory").join("test-package");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut xtask = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    xtask.current_dir(workspace).args(["run", "-q", "-p", "xtask", "--", "package", "--debug", "--output"]).arg(&dir);
    // This process's CARGO_* variables describe the test crate, not the
    // build to run; passed on, they would make cargo rebuild.
    for (key, _) in std::env::vars() {
        if key.starts_with("CARGO_") && key != "CARGO_HOME" {
            xtask.env_remove(key);
        }
    }
    let out = xtask.output().expect("cargo xtask package");
    let log = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "cargo xtask package --debug failed:\n{log}");
    let debs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "one .deb in {}: {debs:?}", dir.display());
    DebugPackage { deb: debs.into_iter().next().unwrap(), log }
}
