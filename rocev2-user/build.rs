//! Builds the eBPF programs (rocev2-ebpf) for the BPF target with aya-build
//! and leaves the object at `$OUT_DIR/rocev2`.
//!
//! `AYA_BUILD_SKIP=1` skips that (no nightly, no bpf-linker needed) so
//! `cargo check`, clippy and host unit tests run anywhere; the binary then
//! carries an empty object and says so when asked to load it.
//!
//! It also sets `ROCEV2_GIT_COMMIT` (for `rocev2 --version`): the commit
//! of the checkout, the `ROCEV2_GIT_COMMIT` variable when building from a
//! tarball or a package recipe, or "unknown".

use std::{env, fs, path::PathBuf, process::Command};

fn main() -> anyhow::Result<()> {
    git_commit();
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let object = out_dir.join("rocev2");
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skip {
        println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
        fs::write(&object, [])?;
        return Ok(());
    }
    let ebpf = aya_build::Package {
        name: "rocev2-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../rocev2-ebpf"),
        ..Default::default()
    };
    aya_build::build_ebpf([ebpf], aya_build::Toolchain::default())
}

/// Sets `ROCEV2_GIT_COMMIT` for the crate and makes cargo re-run this script
/// when the checkout moves to another commit.
fn git_commit() {
    println!("cargo:rerun-if-env-changed=ROCEV2_GIT_COMMIT");
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    };
    let commit = env::var("ROCEV2_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=ROCEV2_GIT_COMMIT={commit}");
    // HEAD names the branch; the branch's ref (or packed-refs) names the commit.
    let mut watch = vec![git(&["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(git(&["rev-parse", "--git-path", &branch]));
        watch.push(git(&["rev-parse", "--git-path", "packed-refs"]));
    }
    for path in watch.into_iter().flatten() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
