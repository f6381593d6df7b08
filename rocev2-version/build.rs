//! Sets `ROCEV2_GIT_COMMIT` (see src/lib.rs) and makes cargo re-run this
//! script when the checkout moves to another commit.

use std::{env, path::PathBuf, process::Command};

fn main() {
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
