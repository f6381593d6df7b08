//! `cargo xtask <command>`: the project's entry points for people and CI.
//!
//! - `setup`: installs what a fresh Debian machine lacks (idempotent, fast
//!   when everything is present).
//! - `lint`: formatting, clippy, the API docs and the book, warnings denied,
//!   links checked; no root.
//! - `docs`: builds the book (`docs/`, mdBook) into `target/book`.
//! - `build`, `test`, `demo`: run `setup` first, then do their job (`test`
//!   runs `lint` before any test).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

mod layers;
mod links;

#[derive(Parser)]
#[command(about = "rocev2 developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install missing prerequisites (nightly rust-src, LLVM 22, bpf-linker, iproute2, ethtool, scapy, FRR, systemd, man-db, lintian, linux-perf, debootstrap, qemu, cargo-deb, mdbook) and build the tests' Debian trees (the RDMA guests', the systemd container's).
    Setup,
    /// Build everything, including the eBPF programs.
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Check formatting (cargo fmt), the layers (no import points up a layer, no cycle), lints (clippy -D warnings), the API docs (cargo doc) and the book (mdbook), warnings denied, links checked; needs no root.
    Lint,
    /// Build the book (docs/, mdBook) into target/book and check its links; needs no root.
    Docs,
    /// Run `lint`, then every test: host unit tests, BPF_PROG_TEST_RUN fixtures and netns labs (needs root).
    Test {
        /// Extra arguments for the test binaries (e.g. a test name filter).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Build and run the built-in demo: QP hashing vs five-tuple hashing in a veth lab (needs root).
    Demo,
    /// Build (release) and run the benchmarks; prints one table and writes BENCHMARKS.md (needs root).
    Bench,
    /// Build the Debian package (cargo-deb): binary, unit, example config, man pages, completions; then lintian.
    Package {
        /// Package the debug build instead of the release build (faster; for tests).
        #[arg(long)]
        debug: bool,
        /// Where to write the .deb (default target/package/).
        #[arg(long, value_name = "DIR")]
        output: Option<PathBuf>,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Task::Setup => {
            setup()?;
            debian_trees()
        }
        Task::Build { release } => {
            setup()?;
            build(release)
        }
        Task::Lint => {
            setup_for_lint()?;
            lint()
        }
        Task::Docs => {
            setup_for_lint()?;
            stage("the book (mdbook build, links checked)", docs)?;
            println!("xtask: the book is in {}", workspace().join("target/book/index.html").display());
            Ok(())
        }
        Task::Test { args } => {
            setup()?;
            debian_trees()?;
            test(&args)
        }
        Task::Demo => {
            setup()?;
            build(true)?;
            require_root("the demo creates network namespaces and attaches XDP programs")?;
            run(Command::new(workspace().join("target/release/rocev2")).arg("demo"))
        }
        Task::Bench => {
            setup()?;
            build(true)?;
            require_root("the benchmark loads XDP programs and creates network namespaces")?;
            let out = workspace().join("BENCHMARKS.md");
            run(Command::new(workspace().join("target/release/rocev2")).arg("bench").arg("--out").arg(out))
        }
        Task::Package { debug, output } => {
            setup()?;
            build(!debug)?;
            package(debug, output)
        }
    }
}

/// Writes the generated assets (man pages, completions) to
/// `target/<profile>/package-assets`, where
/// rocev2-user's `[package.metadata.deb]` expects them, runs cargo-deb on
/// the binary just built, then lintian; an error from lintian fails.
fn package(debug: bool, output: Option<PathBuf>) -> Result<()> {
    let root = workspace();
    let profile_dir = root.join(if debug { "target/debug" } else { "target/release" });
    let bin = profile_dir.join("rocev2");
    let assets = profile_dir.join("package-assets");
    if assets.exists() {
        std::fs::remove_dir_all(&assets).with_context(|| format!("cannot remove {}", assets.display()))?;
    }
    let (man, completions) = (assets.join("man"), assets.join("completions"));
    std::fs::create_dir_all(&completions)?;
    run(Command::new(&bin).arg("man").arg("--out-dir").arg(&man))?;
    // Debian wants man pages compressed, without a timestamp (reproducible).
    run(Command::new("sh").arg("-c").arg("gzip -9n -- *.1 *.5").current_dir(&man))?;
    for (shell, file) in [("bash", "rocev2"), ("zsh", "_rocev2"), ("fish", "rocev2.fish")] {
        let out = Command::new(&bin).args(["completions", shell]).output()?;
        if !out.status.success() {
            bail!("rocev2 completions {shell} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::fs::write(completions.join(file), out.stdout)?;
    }
    // Not cargo-deb's target/debian: every cargo-deb run (the test's
    // `--debug` one too) deletes the package's older .debs from there.
    let out_dir = output.unwrap_or_else(|| root.join("target/package"));
    std::fs::create_dir_all(&out_dir)?;
    let mut deb = cargo();
    deb.args(["deb", "-p", "rocev2-user", "--no-build", "--output"]).arg(&out_dir);
    if debug {
        deb.args(["--profile", "dev", "--strip", "--fast"]);
    }
    let out = deb.stderr(std::process::Stdio::inherit()).output().context("cannot run cargo deb")?;
    if !out.status.success() {
        bail!("cargo deb failed with {}", out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let deb_path = stdout.lines().rev().find(|l| l.trim_end().ends_with(".deb")).context("cargo deb named no .deb")?;
    let deb_path = PathBuf::from(deb_path.trim());
    println!("xtask: built {}", deb_path.display());
    let lint = Command::new("lintian").arg(&deb_path).output().context("cannot run lintian")?;
    let report = String::from_utf8_lossy(&lint.stdout);
    print!("{report}");
    if report.lines().any(|l| l.starts_with("E: ")) {
        bail!("lintian reports errors on {}", deb_path.display());
    }
    println!("xtask: lintian: no errors");
    Ok(())
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.current_dir(workspace());
    cmd
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program).args(args).output().is_ok_and(|o| o.status.success())
}

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

fn require_root(why: &str) -> Result<()> {
    if !is_root() {
        bail!("run as root: {why}");
    }
    Ok(())
}

fn build(release: bool) -> Result<()> {
    let mut cmd = cargo();
    // Default members: everything but the eBPF crate, which build.rs builds
    // (its own output goes to target/*/build/rocev2-user-*/out/ebpf-build.log).
    cmd.args(["build", "--bins"]);
    if release {
        cmd.arg("--release");
    }
    let what = if release { "build (release, with the eBPF programs)" } else { "build (with the eBPF programs)" };
    stage(what, || run(&mut cmd))
}

fn test(args: &[String]) -> Result<()> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    if !is_root() {
        if ci {
            bail!("CI=true but not running as root: the fixture and netns tests need root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN)");
        }
        eprintln!("xtask: warning: not root, the privileged tests will fail; run `sudo cargo xtask test`");
    }
    lint()?;
    // The netns tests start the real binary; build it first.
    build(false)?;
    let mut cmd = cargo();
    cmd.args(["test", "--", "--test-threads=2"]).args(args);
    cmd.env("ROCEV2_BIN", workspace().join("target/debug/rocev2"));
    let totals = run_counting_tests(&mut cmd)?;
    // One closing line for the whole run: cargo's own last line is the
    // (empty) doc-test run of the last crate.
    println!("tests: {} passed, {} failed, {} ignored", totals.passed, totals.failed, totals.ignored);
    if totals.passed == 0 {
        bail!("no test ran");
    }
    Ok(())
}

/// The gates before any test: the tree is formatted (rustfmt.toml),
/// clippy has nothing to say about any target of any crate, and `cargo
/// doc` builds the API docs without a warning (broken intra-doc links,
/// links to private items, stray HTML).
fn lint() -> Result<()> {
    stage("formatting (cargo fmt --check)", || {
        run(cargo().args(["fmt", "--all", "--", "--check"]))
            .context("the tree is not formatted: run `cargo fmt --all` and commit the result")
    })?;
    stage("layers (no import points up a layer, no import cycle)", || layers::lint(&workspace()))?;
    stage("lints (cargo clippy -D warnings)", || {
        run(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))
            .context("clippy found something: fix it (the messages are above)")
    })?;
    stage("API docs (cargo doc, warnings denied)", || {
        // The default members: the eBPF crate builds for the bpf target
        // only (and its `rocev2` binary's docs would collide with the CLI's).
        run(cargo().args(["doc", "--no-deps", "--quiet"]).env("RUSTDOCFLAGS", "-D warnings"))
            .context("cargo doc found something: fix it (the messages are above)")
    })?;
    stage("the book (mdbook build, links checked)", docs)
}

/// Builds the book with mdbook, failing on any warning it prints, then
/// checks every internal link of the result and of README.md, every
/// include, and that SUMMARY.md lists every chapter.
fn docs() -> Result<()> {
    let out = Command::new("mdbook")
        .arg("build")
        .arg(workspace().join("docs"))
        .output()
        .context("cannot run mdbook (`cargo xtask setup` installs it)")?;
    let said = String::from_utf8_lossy(&out.stderr);
    eprint!("{said}");
    if !out.status.success() {
        bail!("mdbook build failed with {}", out.status);
    }
    if said.lines().any(|l| l.contains("WARN") || l.contains("ERROR")) {
        bail!("mdbook printed warnings (above): the book must build without any");
    }
    let broken = links::check_book(&workspace().join("target/book"))?
        .into_iter()
        .chain(links::check_markdown(&workspace(), Path::new("README.md"))?)
        .chain(links::check_includes(&workspace().join("docs/src"))?)
        .chain(links::check_summary(&workspace().join("docs/src"))?)
        .collect::<Vec<_>>();
    if !broken.is_empty() {
        bail!("the book has {} broken link(s) or missing chapter(s):\n  {}", broken.len(), broken.join("\n  "));
    }
    Ok(())
}

/// Runs one step, then prints one line with its outcome and time.
fn stage(what: &str, step: impl FnOnce() -> Result<()>) -> Result<()> {
    let start = std::time::Instant::now();
    eprintln!("xtask: {what} ...");
    let result = step();
    let outcome = if result.is_ok() { "ok" } else { "FAILED" };
    eprintln!("xtask: {what}: {outcome} ({:.1} s)", start.elapsed().as_secs_f64());
    result
}

#[derive(Default)]
struct Totals {
    passed: u64,
    failed: u64,
    ignored: u64,
}

/// Runs `cargo test`, echoing its output, and adds up libtest's
/// `test result: ok. N passed; M failed; K ignored; ...` lines.
fn run_counting_tests(cmd: &mut Command) -> Result<Totals> {
    use std::io::{BufRead as _, BufReader};
    let mut child =
        cmd.stdout(std::process::Stdio::piped()).spawn().with_context(|| format!("cannot start {cmd:?}"))?;
    let mut totals = Totals::default();
    for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(kind), Some(n)) = (words.next(), words.next()) else { continue };
                let Ok(n) = n.parse::<u64>() else { continue };
                match kind {
                    "passed" => totals.passed += n,
                    "failed" => totals.failed += n,
                    "ignored" => totals.ignored += n,
                    _ => {}
                }
            }
        }
    }
    let status = child.wait()?;
    if !status.success() {
        println!("tests: {} passed, {} failed, {} ignored", totals.passed, totals.failed, totals.ignored);
        bail!("{cmd:?} failed with {status}");
    }
    Ok(totals)
}

// ---------------------------------------------------------------- setup

const BPF_LINKER_VERSION: &str = "0.13";
const LLVM_PACKAGES: &[&str] = &["llvm-22-dev", "libpolly-22-dev", "libzstd-dev", "zlib1g-dev"];
/// Runtime tools: `ip` for namespaces, `ethtool` for veth GRO, scapy as an
/// independent RoCEv2/ICRC decoder in the tests, FRR (zebra + bgpd) as the
/// routing daemon of the kernel-routes tests and `lab up --routing bgp`; for
/// packaging: `systemd` (systemd-analyze verify on the unit, no running
/// systemd needed), `man-db` (verify looks up Documentation=man:),
/// `lintian` (checks the .deb), `linux-perf` (`rocev2 bench --profile`
/// samples with `perf record`); for the RDMA guests (`lab up --rdma-hosts`,
/// the real-RDMA tests): `debootstrap` builds their Debian tree,
/// `qemu-system-x86` boots them (TCG); `systemd-container`
/// (`systemd-nspawn`) boots the service test's Debian container.
const TOOL_PACKAGES: &[&str] = &[
    "iproute2",
    "ethtool",
    "python3-scapy",
    "frr",
    "systemd",
    "man-db",
    "lintian",
    "linux-perf",
    "debootstrap",
    "qemu-system-x86",
    "systemd-container",
];
/// cargo-deb builds the .deb (`cargo xtask package`); 3.8 builds with rustc 1.95.
const CARGO_DEB_VERSION: &str = "3.8";
/// mdbook builds the book (`cargo xtask docs`); 0.5.4 needs rustc 1.88. Built
/// without its `serve` and `watch` features (a web server and a file
/// watcher nobody here needs), with `search` (the book's search box).
const MDBOOK_VERSION: &str = "0.5.4";

fn setup() -> Result<()> {
    let start = std::time::Instant::now();
    install_prerequisites(TOOL_PACKAGES)?;
    if !cargo_deb_ok() {
        eprintln!("xtask: installing cargo-deb {CARGO_DEB_VERSION}");
        run(cargo().args(["install", "cargo-deb", "--locked", "--version", &format!("~{CARGO_DEB_VERSION}")]))?;
    }
    // One line even when nothing was missing, so a reader sees setup ran.
    eprintln!("xtask: setup: prerequisites present ({:.1} s)", start.elapsed().as_secs_f64());
    Ok(())
}

/// The real-RDMA tests' guests boot a Debian tree, and the service test
/// boots systemd in a container over another, that debootstrap builds from
/// deb.debian.org (minutes on 2 cores): setup builds them, once per
/// recipe, in the lab's default cache outside the clone
/// (/var/cache/rocev2/trees, or ROCEV2_TREE_CACHE), where the tests look
/// for them; under CI=true they fail rather than build one in the suite's
/// time. Only `setup` and `test` build them: `demo`, `build`, `bench` and
/// `package` need neither the trees nor the debug build that makes them (a
/// fresh clone's demo compiled everything twice).
fn debian_trees() -> Result<()> {
    if !is_root() {
        eprintln!("xtask: not root: the tests' Debian trees are not built (`sudo cargo xtask setup` builds them)");
        return Ok(());
    }
    build(false)?;
    for (recipe, what) in [("rdma-guest", "the RDMA guests'"), ("systemd", "the service test's systemd")] {
        let mut tree = Command::new(workspace().join("target/debug/rocev2"));
        tree.args(["lab", "tree", "--recipe", recipe]);
        // The tests' override of the cache, if set, is where they will look.
        if let Some(cache) = std::env::var_os("ROCEV2_TREE_CACHE") {
            tree.arg("--tree-cache").arg(cache);
        }
        stage(&format!("{what} Debian tree (rocev2 lab tree --recipe {recipe})"), || run(&mut tree))?;
    }
    Ok(())
}

/// What `lint` needs: the toolchain, bpf-linker (the eBPF crate is built
/// by rocev2-user's build script) and mdbook, none of the runtime tools;
/// so on a machine that has the toolchain it needs no root.
fn setup_for_lint() -> Result<()> {
    install_prerequisites(&[])
}

fn install_prerequisites(tool_packages: &[&'static str]) -> Result<()> {
    let mut apt = Apt::default();
    let mut missing_tools: Vec<&str> = tool_packages.iter().copied().filter(|p| !apt.installed(p)).collect();
    let need_linker = !bpf_linker_ok();
    if need_linker {
        missing_tools.extend(LLVM_PACKAGES.iter().copied().filter(|p| !apt.installed(p)));
    }
    if !missing_tools.is_empty() {
        apt.install(&missing_tools)?;
    }
    ensure_nightly_rust_src()?;
    ensure_lint_tools()?;
    if need_linker {
        install_bpf_linker()?;
    }
    if !mdbook_ok() {
        eprintln!("xtask: installing mdbook {MDBOOK_VERSION}");
        run(cargo().args([
            "install",
            "mdbook",
            "--locked",
            "--version",
            MDBOOK_VERSION,
            "--no-default-features",
            "--features",
            "search",
        ]))?;
    }
    Ok(())
}

fn mdbook_ok() -> bool {
    output("mdbook", &["--version"]).is_some_and(|v| v.trim() == format!("mdbook v{MDBOOK_VERSION}"))
}

fn cargo_deb_ok() -> bool {
    output("cargo-deb", &["--version"]).is_some_and(|v| v.contains(&format!(" {CARGO_DEB_VERSION}.")))
}

#[derive(Default)]
struct Apt {
    updated: bool,
}

impl Apt {
    fn installed(&self, package: &str) -> bool {
        output("dpkg-query", &["-W", "-f=${Status}", package]).is_some_and(|s| s.contains("install ok installed"))
    }

    fn install(&mut self, packages: &[&str]) -> Result<()> {
        if !Path::new("/usr/bin/apt-get").exists() {
            bail!(
                "missing prerequisites: {}. This setup installs them with apt-get on Debian/Ubuntu; on this system install the equivalent packages by hand (LLVM 22 development files, then `cargo install bpf-linker --no-default-features --features llvm-22`)",
                packages.join(", ")
            );
        }
        if !is_root() {
            bail!("missing packages {}: run `sudo cargo xtask setup` (or apt-get install them)", packages.join(" "));
        }
        eprintln!("xtask: installing {}", packages.join(" "));
        if !self.updated {
            run(Command::new("apt-get").args(["update", "-q"]))?;
            self.updated = true;
        }
        run(Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"))
    }
}

fn ensure_nightly_rust_src() -> Result<()> {
    let sysroot = output("rustc", &["+nightly", "--print", "sysroot"]);
    let has_src =
        sysroot.as_deref().is_some_and(|s| Path::new(s.trim()).join("lib/rustlib/src/rust/library/core").exists());
    if has_src {
        return Ok(());
    }
    if !succeeds("rustup", &["--version"]) {
        bail!("rustup is required to build the eBPF programs (nightly toolchain with rust-src); see https://rustup.rs");
    }
    eprintln!("xtask: installing the nightly toolchain's rust-src component");
    if sysroot.is_none() {
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))
    } else {
        run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", "nightly"]))
    }
}

/// `cargo xtask test` runs rustfmt and clippy first; a toolchain installed
/// with rustup's minimal profile has neither.
fn ensure_lint_tools() -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let missing: Vec<&str> = [("fmt", "rustfmt"), ("clippy", "clippy")]
        .into_iter()
        .filter(|(sub, _)| !succeeds(&cargo, &[sub, "--version"]))
        .map(|(_, component)| component)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !succeeds("rustup", &["--version"]) {
        bail!(
            "missing {}: install them for this toolchain (rustup component add {})",
            missing.join(" and "),
            missing.join(" ")
        );
    }
    eprintln!("xtask: installing the {} component(s)", missing.join(" and "));
    run(Command::new("rustup").args(["component", "add"]).args(&missing))
}

fn bpf_linker_ok() -> bool {
    output("bpf-linker", &["--version"]).is_some_and(|v| v.contains(&format!(" {BPF_LINKER_VERSION}.")))
}

fn install_bpf_linker() -> Result<()> {
    eprintln!("xtask: building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (about 80 s)");
    let path = format!("/usr/lib/llvm-22/bin:{}", std::env::var("PATH").unwrap_or_default());
    run(cargo()
        .args([
            "install",
            "bpf-linker",
            "--version",
            &format!("~{BPF_LINKER_VERSION}"),
            "--no-default-features",
            "--features",
            "llvm-22",
        ])
        .env("LLVM_SYS_221_PREFIX", "/usr/lib/llvm-22")
        .env("PATH", path))?;
    if !bpf_linker_ok() {
        bail!("bpf-linker was installed but `bpf-linker --version` does not report {BPF_LINKER_VERSION}.x; is ~/.cargo/bin on PATH?");
    }
    Ok(())
}
