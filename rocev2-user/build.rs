//! Builds the eBPF programs (rocev2-ebpf) for the BPF target and leaves
//! each program object at `$OUT_DIR/<bin name>` (`$OUT_DIR/rocev2`, the
//! forwarding programs, and `$OUT_DIR/rocev2-tools`, the tools' programs).
//!
//! This is the build aya-build 0.2 does (`rustup run nightly cargo build
//! --target bpfel-unknown-none -Z build-std=core --release` with BTF), with
//! one difference: aya-build relays every line of that build as a `cargo:
//! warning`, so each build, even one where nothing changed, printed dozens
//! of `warning: rocev2-user@0.1.0: Compiling ...` lines. Here the nested
//! build's output goes to `$OUT_DIR/ebpf-build.log`; cargo's own progress
//! bar shows the step, and a failure prints the log's last lines and names
//! the file.
//!
//! `AYA_BUILD_SKIP=1` skips that (no nightly, no bpf-linker needed) so
//! `cargo check`, clippy and host unit tests run anywhere; the binary then
//! carries an empty object and says so when asked to load it.

use std::{
    env,
    ffi::OsString,
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{anyhow, bail, Context as _, Result};

const PACKAGE: &str = "rocev2-ebpf";
const TOOLCHAIN: &str = "nightly";
/// Lines of the log a failure shows.
const TAIL: usize = 40;

fn main() {
    // Printed by hand: an `Err` from main would add a backtrace whenever
    // RUST_BACKTRACE is set, burying the one line that matters.
    if let Err(e) = build() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn build() -> Result<()> {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        for object in ["rocev2", "rocev2-tools"] {
            fs::write(out_dir.join(object), [])?;
        }
        return Ok(());
    }
    let root_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(PACKAGE);
    // The build-dependency on rocev2-ebpf rebuilds us when its library
    // changes; this covers the program binaries too.
    println!("cargo:rerun-if-changed={}", root_dir.display());
    build_ebpf(&out_dir)
}

fn build_ebpf(out_dir: &Path) -> Result<()> {
    let endian = env::var("CARGO_CFG_TARGET_ENDIAN").context("CARGO_CFG_TARGET_ENDIAN not set")?;
    let target = match endian.as_str() {
        "little" => "bpfel-unknown-none",
        "big" => "bpfeb-unknown-none",
        other => bail!("unsupported endianness {other}"),
    };
    let arch = env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    let arch = if arch.starts_with("riscv64") { "riscv64".to_string() } else { arch };

    let mut cmd = Command::new("rustup");
    cmd.args(["run", TOOLCHAIN, "cargo", "build", "--package", PACKAGE, "--bins", "--release"]).args([
        "--message-format=json-render-diagnostics",
        "--target",
        target,
        "-Z",
        "build-std=core",
    ]);
    let mut rustflags = OsString::new();
    for (i, flag) in [format!("--cfg=bpf_target_arch=\"{arch}\""), "-Cdebuginfo=2".into(), "-Clink-arg=--btf".into()]
        .iter()
        .enumerate()
    {
        if i > 0 {
            rustflags.push("\x1f");
        }
        rustflags.push(flag);
    }
    cmd.env("CARGO_ENCODED_RUSTFLAGS", rustflags);
    // The nightly toolchain's own rustc, not the one this build runs with.
    for key in ["RUSTC", "RUSTC_WORKSPACE_WRAPPER"] {
        cmd.env_remove(key);
    }
    // Separate from this build's target directory (cargo would wait on its
    // own lock) and the same as aya-build's, so earlier builds are reused.
    cmd.arg("--target-dir").arg(out_dir.join("aya-build").join("target").join(PACKAGE));

    let log_path = out_dir.join("ebpf-build.log");
    fs::File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
    let append = || fs::OpenOptions::new().append(true).open(&log_path);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(append()?)
        .spawn()
        .with_context(|| format!("cannot start {cmd:?}: is rustup installed (`cargo xtask setup`)?"))?;
    // stdout: one JSON message per line; the executables are what we want.
    let mut executables = Vec::new();
    let mut log = append()?;
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&line) else {
            use std::io::Write as _;
            writeln!(log, "{line}")?;
            continue;
        };
        if message["reason"] == "compiler-artifact" {
            if let (Some(name), Some(exe)) = (message["target"]["name"].as_str(), message["executable"].as_str()) {
                executables.push((name.to_string(), PathBuf::from(exe)));
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        let text = fs::read_to_string(&log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for line in &lines[lines.len().saturating_sub(TAIL)..] {
            eprintln!("{line}");
        }
        return Err(anyhow!(
            "building the eBPF programs ({PACKAGE} for {target} with the {TOOLCHAIN} toolchain) failed ({status}); the last {TAIL} lines are above, the whole output is in {}",
            log_path.display()
        ));
    }
    if executables.is_empty() {
        bail!("the eBPF build produced no program object; its output is in {}", log_path.display());
    }
    for (name, exe) in executables {
        let dst = out_dir.join(&name);
        fs::copy(&exe, &dst).with_context(|| format!("cannot copy {} to {}", exe.display(), dst.display()))?;
    }
    Ok(())
}
