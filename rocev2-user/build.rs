//! Builds the eBPF programs (rocev2-ebpf) for the BPF target with aya-build
//! and leaves the object at `$OUT_DIR/rocev2`.
//!
//! `AYA_BUILD_SKIP=1` skips that (no nightly, no bpf-linker needed) so
//! `cargo check`, clippy and host unit tests run anywhere; the binary then
//! carries an empty object and says so when asked to load it.

use std::{env, fs, path::PathBuf};

fn main() -> anyhow::Result<()> {
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
