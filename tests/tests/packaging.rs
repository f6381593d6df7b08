//! Issue 16: what gets installed on a switch: the systemd unit, the example
//! config, and the Debian package built by `cargo xtask package`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use rocev2_tests::rocev2_bin;
use rocev2_user::config::Config;

fn packaging(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging").join(file)
}

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("rocev2-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_example_config_is_valid_and_check_accepts_it() {
    let path = packaging("rocev2.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let config = Config::parse(&text, &path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.ports.len(), 1);
    assert_eq!(config.groups[0].members.len(), 4);
    assert_eq!(config.routes.len(), 2);
    assert_eq!(config.dataplane.pin_dir, Path::new("/sys/fs/bpf/rocev2"), "the unit may write only there");
    let out = Command::new(rocev2_bin()).args(["check", "--config"]).arg(&path).output().unwrap();
    assert!(out.status.success(), "rocev2 check: {}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("OK (1 ports, 1 groups, 4 members, 2 routes)"));
}

/// `systemd-analyze verify` on the unit as shipped, except that ExecStart
/// and ExecReload name the binary just built (verify checks the command
/// exists) and the man pages it generates are on MANPATH (verify checks
/// Documentation=man:rocev2(1) too). Any complaint on stderr fails.
#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let dir = TempDir::new("unit-verify");
    let unit = std::fs::read_to_string(packaging("rocev2.service")).unwrap();
    assert!(unit.contains("\nType=notify\n") && unit.contains("\nExecStart=/usr/bin/rocev2 run\n"), "{unit}");
    assert!(unit.contains("\nExecReload=/usr/bin/rocev2 reload\n") && unit.contains("\nRestart=on-failure\n"));
    let bin = rocev2_bin().canonicalize().unwrap();
    let copy = dir.0.join("rocev2.service");
    std::fs::write(&copy, unit.replace("/usr/bin/rocev2", bin.to_str().unwrap())).unwrap();
    let man = dir.0.join("man");
    let out = Command::new(&bin).args(["man", "--out-dir"]).arg(man.join("man1")).output().unwrap();
    assert!(out.status.success(), "rocev2 man: {}", String::from_utf8_lossy(&out.stderr));

    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .env("MANPATH", &man)
        .output()
        .expect("systemd-analyze (Debian package systemd; `cargo xtask setup` installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stderr.trim().is_empty(), "systemd-analyze verify: {}\n{stderr}", out.status);

    // The check is real: a misspelt key is reported.
    std::fs::write(&copy, unit.replace("/usr/bin/rocev2", bin.to_str().unwrap()) + "ProtectSystm=strict\n").unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&copy).env("MANPATH", &man).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("ProtectSystm"), "verify must flag an unknown key");
}
