//! Issue 16: what gets installed on a switch: the systemd unit, the example
//! config, and the Debian package built by `cargo xtask package`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use rocev2_tests::{package::debug_package, rocev2_bin, RemoveOnDrop};
use rocev2_user::control::config::Config;

fn packaging(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging").join(file)
}

/// Parsed as `run` and `check` parse it. (Not `rocev2 check` itself: that
/// is to check the live system too, where eth1..eth5 need not exist.)
#[test]
fn the_example_config_is_valid() {
    let path = packaging("rocev2.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let config = Config::parse(&text, &path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.ports.len(), 1);
    assert_eq!(config.groups[0].members.len(), 4);
    assert_eq!(config.routes.len(), 2);
    assert_eq!(config.dataplane.pin_dir, Path::new("/sys/fs/bpf/rocev2"), "the unit may write only there");
    // Every line is either TOML or a comment that explains it.
    let comments = text.lines().filter(|l| l.trim_start().starts_with('#')).count();
    assert!(comments >= 20, "a commented example: {comments} comment lines");
}

/// `systemd-analyze verify` on the unit as shipped, except that ExecStart
/// and ExecReload name the binary just built (verify checks the command
/// exists) and the man pages it generates are on MANPATH (verify checks
/// Documentation=man:rocev2(1) too). Any complaint on stderr fails.
#[test]
fn the_systemd_unit_passes_systemd_analyze_verify() {
    let dir = RemoveOnDrop::scratch("unit-verify");
    let unit = std::fs::read_to_string(packaging("rocev2.service")).unwrap();
    assert!(unit.contains("\nType=notify\n") && unit.contains("\nExecStart=/usr/bin/rocev2 run\n"), "{unit}");
    assert!(unit.contains("\nExecReload=/usr/bin/rocev2 reload\n") && unit.contains("\nRestart=on-failure\n"));
    let bin = rocev2_bin().canonicalize().unwrap();
    let copy = dir.path().join("rocev2.service");
    std::fs::write(&copy, unit.replace("/usr/bin/rocev2", bin.to_str().unwrap())).unwrap();
    let man = dir.path().join("man");
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

fn dpkg_deb(args: &[&str], deb: &Path) -> String {
    let out = Command::new("dpkg-deb").args(args).arg(deb).output().expect("dpkg-deb");
    assert!(out.status.success(), "dpkg-deb {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `cargo xtask package --debug` (the debug build keeps the test quick; the
/// release package is built the same way) and what the .deb holds.
#[test]
fn the_debian_package_holds_binary_unit_conffile_man_pages_and_completions() {
    let built = debug_package();
    // xtask ran lintian on it and fails on any error ("E: ") it reports.
    assert!(built.log.contains("xtask: lintian: no errors"), "{}", built.log);
    let deb = &built.deb;
    let dir = RemoveOnDrop::scratch("deb");

    let info = dpkg_deb(&["--info"], deb);
    assert!(info.contains(" Package: rocev2\n") && info.contains(" Section: net\n"), "{info}");
    let depends = info.lines().find_map(|l| l.trim().strip_prefix("Depends: ")).expect("a Depends line");
    assert!(depends.starts_with("libc6 (>= ") && !depends.contains(','), "only libc at run time: {depends}");
    assert!(info.contains(" Suggests: iproute2, ethtool\n"), "{info}");
    let field = |name: &str| dpkg_deb(&["--field"], deb).lines().any(|l| l.starts_with(name));
    assert!(field("Description: "));

    let contents = dpkg_deb(&["--contents"], deb);
    for path in [
        "./usr/bin/rocev2",
        "./etc/rocev2/rocev2.toml",
        "./usr/lib/systemd/system/rocev2.service",
        "./usr/share/man/man1/rocev2.1.gz",
        "./usr/share/man/man1/rocev2-run.1.gz",
        "./usr/share/man/man5/rocev2.toml.5.gz",
        "./usr/share/bash-completion/completions/rocev2",
        "./usr/share/zsh/vendor-completions/_rocev2",
        "./usr/share/fish/vendor_completions.d/rocev2.fish",
        "./usr/share/doc/rocev2/copyright",
        "./usr/share/doc/rocev2/changelog.Debian.gz",
        "./usr/share/doc/rocev2/grafana-dashboard.json",
    ] {
        assert!(contents.lines().any(|l| l.ends_with(&format!(" {path}"))), "{path} missing:\n{contents}");
    }

    // Control files: the config is a conffile; the upgrade path is wired in.
    let control = dir.path().join("control");
    let out = Command::new("dpkg-deb").arg("--control").arg(deb).arg(&control).output().unwrap();
    assert!(out.status.success());
    assert_eq!(std::fs::read_to_string(control.join("conffiles")).unwrap().trim(), "/etc/rocev2/rocev2.toml");
    let postinst = std::fs::read_to_string(control.join("postinst")).unwrap();
    assert!(postinst.contains("/usr/bin/rocev2 upgrade"), "{postinst}");
    let prerm = std::fs::read_to_string(control.join("prerm")).unwrap();
    assert!(prerm.contains("\"$1\" = remove") && prerm.contains("stop rocev2.service"), "remove stops: {prerm}");

    // The files themselves: unit and config as in packaging/, a binary that
    // runs, names its commit and carries the eBPF object.
    let root = dir.path().join("root");
    let out = Command::new("dpkg-deb").arg("-x").arg(deb).arg(&root).output().unwrap();
    assert!(out.status.success());
    for (installed, source) in
        [("usr/lib/systemd/system/rocev2.service", "rocev2.service"), ("etc/rocev2/rocev2.toml", "rocev2.toml")]
    {
        assert_eq!(
            std::fs::read_to_string(root.join(installed)).unwrap(),
            std::fs::read_to_string(packaging(source)).unwrap(),
            "{installed}"
        );
    }
    let bin = root.join("usr/bin/rocev2");
    let version = Command::new(&bin).arg("--version").output().unwrap();
    let version = String::from_utf8_lossy(&version.stdout);
    assert!(version.starts_with("rocev2 0.1.0 (commit ") && !version.contains("unknown"), "{version}");
    let bytes = std::fs::read(&bin).unwrap();
    let elf_headers = bytes.windows(4).filter(|w| *w == b"\x7fELF").count();
    assert!(elf_headers >= 2, "the eBPF object (an ELF file) is embedded in the binary");
    let out = Command::new(&bin).args(["completions", "bash"]).output().unwrap();
    assert!(out.status.success() && out.stdout.starts_with(b"_rocev2()"), "{}", String::from_utf8_lossy(&out.stderr));
}
