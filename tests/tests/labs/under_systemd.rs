//! Issue 27: the package and its unit under a real systemd as PID 1. A
//! Debian 12 container (`systemd-nspawn -b` over the "systemd" tree that
//! `cargo xtask setup` builds, an overlay so the tree stays as built) boots
//! in the switch namespace of an ECMP lab, with a bpffs of its own on
//! /sys/fs/bpf; the test installs the .deb of `cargo xtask package
//! --debug` and drives the service with systemctl while frames flow from
//! the lab's sender through the container's p0 to the uplinks.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use rocev2_common::bth::{opcode, Bth};
use rocev2_tests::{package::debug_package, rdma::tree_cache, require_root, RemoveOnDrop};
use rocev2_user::testbed::{
    debian_tree::{self, SYSTEMD},
    ecmp_lab::{lab_frame, EcmpLab, Family},
};

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The "systemd" tree: under CI=true it must have been built by `cargo
/// xtask setup` (minutes and a Debian mirror); elsewhere it is built now.
fn systemd_tree() -> PathBuf {
    let cache = tree_cache();
    if let Some(path) = debian_tree::built(&SYSTEMD, &cache) {
        return path;
    }
    let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    assert!(
        !ci,
        "CI=true and the \"systemd\" Debian tree (recipe digest {}) is not in {}: `cargo xtask setup` builds it",
        SYSTEMD.digest(),
        cache.display()
    );
    debian_tree::ensure(&SYSTEMD, &cache).expect("build the systemd tree").path
}

/// The .deb of `cargo xtask package --debug` (copied), and the same package
/// as version VERSION+upgrade (a newer build to upgrade to), in `dir`.
fn debs(dir: &Path) -> (PathBuf, PathBuf) {
    let old = dir.join("rocev2-old.deb");
    std::fs::copy(&debug_package().deb, &old).unwrap();
    let unpacked = dir.join("unpacked");
    let run = |args: &[&str]| {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", text(&out));
    };
    run(&["dpkg-deb", "-R", old.to_str().unwrap(), unpacked.to_str().unwrap()]);
    let control = unpacked.join("DEBIAN/control");
    let fields = std::fs::read_to_string(&control).unwrap();
    let version = fields.lines().find_map(|l| l.strip_prefix("Version: ")).expect("Version").to_string();
    std::fs::write(&control, fields.replace(&format!("Version: {version}"), &format!("Version: {version}+upgrade")))
        .unwrap();
    let newer = dir.join("rocev2-newer.deb");
    run(&["dpkg-deb", "-Zgzip", "-z1", "-b", unpacked.to_str().unwrap(), newer.to_str().unwrap()]);
    std::fs::remove_dir_all(&unpacked).unwrap();
    (old, newer)
}

/// A booted container; powered off, its bpffs unmounted and its files
/// removed on drop.
struct Container {
    nspawn: Child,
    leader: u32,
    bpf: PathBuf,
    log: PathBuf,
}

impl Container {
    fn boot(tree: &Path, netns: &str, shared: &Path, name: &str) -> Self {
        let bpf = std::env::temp_dir().join(format!("{name}-bpffs"));
        std::fs::create_dir_all(&bpf).unwrap();
        let out = Command::new("mount").args(["-t", "bpf", "bpf"]).arg(&bpf).output().unwrap();
        assert!(out.status.success(), "mount a bpffs: {}", text(&out));
        let log = std::env::temp_dir().join(format!("{name}.console"));
        let console = std::fs::File::create(&log).unwrap();
        let nspawn = Command::new("systemd-nspawn")
            .args(["--boot", "--directory"])
            .arg(tree)
            .args(["--volatile=overlay", "--register=no", "--keep-unit", "--console=read-only"])
            .arg(format!("--machine={name}"))
            .arg(format!("--network-namespace-path=/run/netns/{netns}"))
            // The unit's capabilities: nspawn's default set has none of
            // them (not even CAP_NET_ADMIN in a network namespace it joins).
            .arg("--capability=CAP_BPF,CAP_PERFMON,CAP_NET_ADMIN")
            .arg("--system-call-filter=bpf perf_event_open")
            .arg(format!("--bind={}:/sys/fs/bpf", bpf.display()))
            .arg(format!("--bind-ro={}:/mnt/rocev2", shared.display()))
            .stdin(Stdio::null())
            .stdout(console.try_clone().unwrap())
            .stderr(console)
            .spawn()
            .expect("systemd-nspawn (Debian package systemd-container; `cargo xtask setup` installs it)");
        let mut container = Self { leader: 0, nspawn, bpf, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while container.leader == 0 {
            assert!(Instant::now() < deadline, "no container process: {}", container.console());
            let children =
                std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children", pid = container.nspawn.id()))
                    .unwrap_or_default();
            container.leader = children.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(0);
            std::thread::sleep(Duration::from_millis(100));
        }
        // Boot finished: `running`, or `degraded` with the failed units named.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let state = container.sh("systemctl is-system-running");
            let state = String::from_utf8_lossy(&state.stdout).trim().to_string();
            if state == "running" {
                break;
            }
            if state == "degraded" {
                panic!("the container booted degraded: {}", text(&container.sh("systemctl --failed --no-pager")));
            }
            assert!(Instant::now() < deadline, "boot did not finish ({state}): {}", container.console());
            std::thread::sleep(Duration::from_millis(250));
        }
        container
    }

    fn console(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `script` run by sh inside the container (all its namespaces).
    fn sh(&self, script: &str) -> Output {
        Command::new("nsenter")
            .args(["-t", &self.leader.to_string(), "-a", "sh", "-c", script])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LANG", "C.UTF-8")
            .output()
            .unwrap()
    }

    /// `script`, which must succeed; what it printed.
    fn ok(&self, script: &str) -> String {
        let out = self.sh(script);
        assert!(out.status.success(), "in the container: {script}: {}\n{}", out.status, text(&out));
        text(&out)
    }

    fn journal(&self) -> String {
        self.ok("journalctl -u rocev2 --no-pager -o cat")
    }

    fn main_pid(&self) -> u32 {
        self.ok("systemctl show -P MainPID rocev2").trim().parse().unwrap()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        // SIGRTMIN+4: systemd's "power off".
        unsafe { libc::kill(self.leader as i32, libc::SIGRTMIN() + 4) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.nspawn.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.nspawn.kill();
                let _ = self.nspawn.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("umount").arg(&self.bpf).status();
        let _ = std::fs::remove_dir(&self.bpf);
        let _ = std::fs::remove_file(&self.log);
    }
}

/// Whether `dev` in `netns` has an XDP program attached.
fn has_xdp(netns: &str, dev: &str) -> bool {
    let out = Command::new("ip").args(["-n", netns, "link", "show", dev]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).contains(" xdp")
}

#[test]
fn the_package_under_systemd_starts_reloads_upgrades_and_stops_without_losing_a_packet() {
    require_root();
    let tree = systemd_tree();
    let name = format!("rocev2-sd{}", std::process::id());
    let shared_dir = RemoveOnDrop::scratch("systemd");
    let shared = shared_dir.path();
    let (old, newer) = debs(shared);
    let lab = EcmpLab::create(2).unwrap();
    let switch = lab.switch.name().to_string();
    let good = lab.config("qp").replace(&lab.pin_dir().display().to_string(), "/sys/fs/bpf/rocev2");
    assert!(good.contains("pin_dir = \"/sys/fs/bpf/rocev2\""), "{good}");
    std::fs::write(shared.join("good.toml"), &good).unwrap();
    std::fs::write(shared.join("five-tuple.toml"), good.replace("hash = \"qp\"", "hash = \"five-tuple\"")).unwrap();
    std::fs::write(shared.join("bad.toml"), good.replace("prefix = \"10.1.0.0/16\"", "prefix = \"10.1.0.1/16\""))
        .unwrap();

    let started = Instant::now();
    let container = Container::boot(&tree, &switch, shared, &name);
    println!("MEASURED: boot {:.1} s", started.elapsed().as_secs_f64());
    let installed = container.ok(&format!("dpkg -i /mnt/rocev2/{}", old.file_name().unwrap().to_str().unwrap()));
    assert!(container.sh("systemctl is-active rocev2").stdout.starts_with(b"inactive"), "{installed}");
    container.ok("cp /mnt/rocev2/good.toml /etc/rocev2/rocev2.toml");

    // start: Type=notify, so systemctl returns after READY=1, by which
    // time the programs are attached.
    container.ok("systemctl start rocev2");
    assert!(has_xdp(&switch, "p0"), "READY before p0 was attached: {}", container.journal());
    assert_eq!(container.ok("systemctl is-active rocev2").trim(), "active");
    // The hardening: the process has exactly the unit's capabilities, and
    // they were enough (it forwards, below).
    let pid = container.main_pid();
    let status = container.ok(&format!("cat /proc/{pid}/status"));
    let caps = |line: &str| status.lines().find_map(|l| l.strip_prefix(line)).unwrap().trim().to_string();
    let want = (1u64 << 12) | (1 << 38) | (1 << 39); // CAP_NET_ADMIN, CAP_PERFMON, CAP_BPF
    assert_eq!(caps("CapEff:"), format!("{want:016x}"), "{status}");
    assert_eq!(caps("CapBnd:"), format!("{want:016x}"), "{status}");
    assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{status}");

    let capture = lab.start_capture().unwrap();
    let frames =
        (0..64u32).map(|q| lab_frame(Family::V4, Bth::new(opcode::WRITE_MIDDLE, 0x100 + q, 0), 2, 256)).collect();
    let stream = lab.start_stream(frames, 5_000).unwrap();
    std::thread::sleep(Duration::from_millis(500));

    // reload: a good config is applied, a bad one refused (systemctl says
    // so, the running config stays, the journal names file, line and key).
    container.ok("cp /mnt/rocev2/five-tuple.toml /etc/rocev2/rocev2.toml && systemctl reload rocev2");
    container.ok("cp /mnt/rocev2/bad.toml /etc/rocev2/rocev2.toml");
    let refused = container.sh("systemctl reload rocev2");
    assert!(!refused.status.success(), "a bad config was accepted: {}", text(&refused));
    assert_eq!(container.ok("systemctl is-active rocev2").trim(), "active", "a refused reload stops nothing");
    assert_eq!(container.main_pid(), pid);
    container.ok("cp /mnt/rocev2/good.toml /etc/rocev2/rocev2.toml && systemctl reload rocev2");

    // The upgrade: dpkg -i of a newer build; its postinst runs `rocev2
    // upgrade`, which hands over and starts the unit again.
    let upgraded = container.ok(&format!("dpkg -i /mnt/rocev2/{}", newer.file_name().unwrap().to_str().unwrap()));
    assert!(container.ok("dpkg-query -W -f '${Version}' rocev2").ends_with("+upgrade"), "{upgraded}");
    assert_eq!(container.ok("systemctl is-active rocev2").trim(), "active", "{upgraded}");
    let new_pid = container.main_pid();
    assert_ne!(new_pid, pid, "the service runs the new build: {upgraded}");
    std::thread::sleep(Duration::from_millis(500));
    let sent = stream.stop().unwrap();
    let report = capture.finish(sent).unwrap();
    let loss = report.loss();
    println!("MEASURED: under systemd (start, reloads, dpkg -i upgrade): {}", loss.describe());
    if let Err(why) = loss.check() {
        panic!("{why}\n{}\n{}\n{}", report.render(), lab.link_drops(), container.journal());
    }
    assert_eq!(report.active_uplinks(), 2, "{}", report.render());

    // stop: detached, unpinned, the final counters in the journal.
    container.ok("systemctl stop rocev2");
    assert!(!has_xdp(&switch, "p0"), "stop left p0 attached");
    assert!(!container.bpf.join("rocev2").exists(), "stop left the pins");
    let journal = container.journal();
    println!("journalctl -u rocev2:\n{journal}");
    for line in [
        "rocev2: ready",
        "reloaded /etc/rocev2/rocev2.toml",
        "route[0].prefix: \"10.1.0.1/16\" has host bits set",
        "handed over",
        "took over p0",
        "rocev2: stopped; final counters:",
    ] {
        assert!(journal.contains(line), "the journal has no {line:?}:\n{journal}");
    }
    assert!(!journal.contains("Failed to adjust resource limit"), "{journal}");
}
