//! Issue 16: `rocev2 run` under systemd. The real binary runs in a lab
//! with NOTIFY_SOCKET pointing at a datagram socket this test owns, which
//! sees exactly what systemd would.

use std::{
    io::{BufRead as _, BufReader},
    os::unix::net::UnixDatagram,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use rocev2_common::bth::{opcode, Bth};
use rocev2_tests::{require_root, rocev2_bin};
use rocev2_user::{
    control::state::RunState,
    testbed::ecmp_lab::{lab_frame, EcmpLab, Family},
};

/// The socket systemd would own; removed on drop.
struct NotifySocket {
    socket: UnixDatagram,
    path: PathBuf,
}

impl NotifySocket {
    fn bind(tag: &str) -> Self {
        let path = PathBuf::from(format!("/tmp/rocev2-notify-{tag}.sock"));
        let _ = std::fs::remove_file(&path);
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        socket.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        Self { socket, path }
    }

    /// The next message within `timeout`, if any.
    fn recv(&self, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 4096];
        while Instant::now() < deadline {
            match self.socket.recv(&mut buf) {
                Ok(n) => return Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
                // A signal to this test process (another test's child exiting)
                // interrupts the wait: wait again.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => panic!("notify socket: {e}"),
            }
        }
        None
    }

    /// The next message that changes the service state (READY=1,
    /// RELOADING=1, STOPPING=1), skipping STATUS-only updates; returns that
    /// state word and the whole message.
    fn next_state(&self, timeout: Duration) -> Option<(String, String)> {
        let deadline = Instant::now() + timeout;
        while let Some(message) = self.recv(deadline.saturating_duration_since(Instant::now())) {
            if let Some(state) = state_of(&message) {
                return Some((state, message));
            }
        }
        None
    }
}

impl Drop for NotifySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn state_of(message: &str) -> Option<String> {
    message.lines().find(|l| matches!(*l, "READY=1" | "RELOADING=1" | "STOPPING=1")).map(str::to_string)
}

/// A `rocev2 run` child, killed on drop if the test failed half way.
struct Daemon {
    child: Option<Child>,
    output: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    fn start(args: &[&str], notify: Option<&NotifySocket>) -> Self {
        Self::start_with(args, notify, &[])
    }

    /// With these environment variables (and RUST_LOG only if given here).
    fn start_with(args: &[&str], notify: Option<&NotifySocket>, env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(rocev2_bin());
        cmd.env_remove("RUST_LOG").envs(env.iter().copied());
        if let Some(notify) = notify {
            cmd.env("NOTIFY_SOCKET", &notify.path);
        }
        let mut child = cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("start rocev2 run");
        let output = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let lines = output.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Self { child: Some(child), output }
    }

    fn output(&self) -> String {
        self.output.lock().unwrap().join("\n")
    }

    /// Waits until the output has a line containing `text`.
    fn wait_for(&self, text: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.output().contains(text) {
            assert!(Instant::now() < deadline, "no {text:?} within {timeout:?}:\n{}", self.output());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&self, signal: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, signal) };
    }

    fn wait(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().unwrap();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                std::thread::sleep(Duration::from_millis(100)); // let the readers finish
                return status;
            }
            assert!(Instant::now() < deadline, "rocev2 run did not exit:\n{}", self.output());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our own child; SIGTERM detaches cleanly.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn run_notifies_ready_reloading_and_stopping_in_order() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let config = lab.write_config("qp").unwrap();
    let notify = NotifySocket::bind(&lab.tag);
    let mut daemon =
        Daemon::start(&["--netns", lab.switch.name(), "run", "--config", config.to_str().unwrap()], Some(&notify));

    // The first message is READY=1, and when it arrives the port is attached
    // and the state (groups, members) is written.
    let first = notify.recv(Duration::from_secs(30)).unwrap_or_else(|| panic!("no message:\n{}", daemon.output()));
    assert_eq!(state_of(&first).as_deref(), Some("READY=1"), "first message: {first:?}\n{}", daemon.output());
    let link = lab.in_switch(&["ip", "-d", "link", "show", "p0"]).unwrap();
    assert!(link.contains("prog/xdp"), "READY=1 before p0 was attached:\n{link}");
    let state = RunState::read(&lab.pin_dir()).unwrap();
    assert_eq!(state.groups[0].members.len(), 2, "READY=1 before the group was filled");
    assert!(
        first.contains("STATUS=forwarding on 1 ports, 1 groups (2 usable members), 2 routes; "),
        "READY comes with a summary: {first:?}"
    );
    // The log line travels through a pipe and a reader thread, the
    // notification through a socket: either may be seen first.
    daemon.wait_for("rocev2: ready", Duration::from_secs(10));

    // A good reload: RELOADING=1, then READY=1.
    daemon.signal(libc::SIGHUP);
    let (s1, _) = notify.next_state(Duration::from_secs(10)).expect("RELOADING=1 after SIGHUP");
    let (s2, _) = notify.next_state(Duration::from_secs(10)).expect("READY=1 after the reload");
    assert_eq!((s1.as_str(), s2.as_str()), ("RELOADING=1", "READY=1"));

    // A refused reload: the old config stays, and the service is ready again.
    std::fs::write(&config, "[[port]]\nname = \"p0\"\n[[route]]\nprefix = \"10.1.0.0/16\"\ngroup = \"nope\"\n")
        .unwrap();
    let out = Command::new(rocev2_bin())
        .args(["reload", "--pin-dir", lab.pin_dir().to_str().unwrap()])
        .output()
        .expect("rocev2 reload");
    assert!(!out.status.success(), "a bad config must fail the reload");
    let (s1, _) = notify.next_state(Duration::from_secs(10)).expect("RELOADING=1 for the refused reload");
    let (s2, _) = notify.next_state(Duration::from_secs(10)).expect("READY=1 after the refused reload");
    assert_eq!((s1.as_str(), s2.as_str()), ("RELOADING=1", "READY=1"));

    // Stop: STOPPING=1, a clean exit, and nothing after it.
    daemon.signal(libc::SIGTERM);
    let (s, message) = notify.next_state(Duration::from_secs(10)).expect("STOPPING=1 on SIGTERM");
    assert_eq!(s, "STOPPING=1", "{message:?}");
    let status = daemon.wait(Duration::from_secs(10));
    assert!(status.success(), "{status}:\n{}", daemon.output());
    assert_eq!(notify.next_state(Duration::from_millis(300)), None, "nothing after STOPPING=1");
}

/// Under `WatchdogSec=` (WATCHDOG_USEC) `run` pings at half the period
/// while its loop runs, and never after STOPPING=1.
#[test]
fn run_pings_the_watchdog_while_its_loop_runs() {
    require_root();
    let lab = EcmpLab::create(1).unwrap();
    let config = lab.write_config("qp").unwrap();
    let notify = NotifySocket::bind(&format!("{}w", lab.tag));
    let args = ["--netns", lab.switch.name(), "run", "--config", config.to_str().unwrap()];
    let mut daemon = Daemon::start_with(&args, Some(&notify), &[("WATCHDOG_USEC", "400000")]);
    let (first, _) = notify.next_state(Duration::from_secs(30)).unwrap_or_else(|| panic!("{}", daemon.output()));
    assert_eq!(first, "READY=1");
    // 0.4 s period: a ping every 0.2 s; count those of 1.5 s.
    let deadline = Instant::now() + Duration::from_millis(1500);
    let mut pings = 0;
    while let Some(message) = notify.recv(deadline.saturating_duration_since(Instant::now())) {
        pings += message.lines().filter(|l| *l == "WATCHDOG=1").count();
    }
    assert!(pings >= 4, "{pings} WATCHDOG=1 in 1.5 s with WATCHDOG_USEC=400000:\n{}", daemon.output());
    daemon.signal(libc::SIGTERM);
    let mut after_stopping = Vec::new();
    let mut stopping = false;
    // Until a quiet second after the exit.
    while let Some(message) = notify.recv(Duration::from_secs(if stopping { 1 } else { 10 })) {
        if stopping {
            after_stopping.push(message);
        } else {
            stopping = message.lines().any(|l| l == "STOPPING=1");
        }
    }
    assert!(stopping, "STOPPING=1 on SIGTERM:\n{}", daemon.output());
    assert!(!after_stopping.iter().any(|m| m.contains("WATCHDOG=1")), "{after_stopping:?}");
    assert!(daemon.wait(Duration::from_secs(10)).success(), "{}", daemon.output());
}

#[test]
fn a_config_error_never_says_ready_and_exits_non_zero() {
    require_root();
    let tag = format!("svc{}", std::process::id());
    let notify = NotifySocket::bind(&tag);
    let dir = PathBuf::from(format!("/tmp/rocev2-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let _cleanup = rocev2_tests::RemoveOnDrop(dir.clone());
    let cases = [
        // Valid TOML, but the port does not exist: fails while resolving.
        (
            "missing-port",
            format!("[dataplane]\npin_dir = \"/sys/fs/bpf/rocev2-{tag}\"\n[[port]]\nname = \"r2nosuch0\"\n"),
        ),
        // A mistake in the file: fails before anything starts.
        ("bad-key", "[[port]]\nname = \"p0\"\n[[route]]\nprefix = \"10.1.0.1/16\"\ngroup = \"x\"\n".to_string()),
    ];
    for (name, text) in cases {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, text).unwrap();
        let mut daemon = Daemon::start(&["run", "--config", config.to_str().unwrap()], Some(&notify));
        let status = daemon.wait(Duration::from_secs(30));
        assert!(!status.success(), "{name}: a config error must fail run:\n{}", daemon.output());
        assert!(daemon.output().contains("rocev2: error:"), "{name}: {}", daemon.output());
        let mut messages = Vec::new();
        while let Some(m) = notify.recv(Duration::from_millis(200)) {
            messages.push(m);
        }
        assert!(!messages.iter().any(|m| m.contains("READY=1")), "{name}: READY=1 despite the error: {messages:?}");
    }
}

/// `rocev2 upgrade` against a live stream: the running instance hands
/// over, the upgrade process becomes the new `rocev2 run` (no systemd here)
/// and takes over p0; no packet is lost.
#[test]
fn upgrade_hands_over_to_the_new_binary_without_losing_a_packet() {
    require_root();
    let lab = EcmpLab::create(4).unwrap();
    let config = lab.write_config("qp").unwrap();
    let old = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let old_pid = RunState::read(&lab.pin_dir()).unwrap().pid;
    let capture = lab.start_capture().unwrap();
    let frames =
        (0..64u32).map(|q| lab_frame(Family::V4, Bth::new(opcode::WRITE_MIDDLE, 0x100 + q, 0), 2, 256)).collect();
    let stream = lab.start_stream(frames, 20_000).unwrap();
    std::thread::sleep(Duration::from_millis(500));

    let upgrade = Daemon::start(&["upgrade", "--pin-dir", lab.pin_dir().to_str().unwrap()], None);
    upgrade.wait_for(&format!("rocev2: pid {old_pid} handed over"), Duration::from_secs(30));
    upgrade.wait_for("took over p0", Duration::from_secs(60));
    upgrade.wait_for("rocev2: ready", Duration::from_secs(30));
    let old_output = old.stop_after_exit(Duration::from_secs(10)).unwrap();
    assert!(old_output.contains("handed over"), "{old_output}");
    let new_pid = RunState::read(&lab.pin_dir()).unwrap().pid;
    assert_ne!(new_pid, old_pid, "a new process runs the dataplane");
    assert_eq!(new_pid, upgrade.child.as_ref().unwrap().id(), "the upgrade process became the new run");
    std::thread::sleep(Duration::from_millis(500));

    let sent = stream.stop().unwrap();
    let report = capture.finish(sent).unwrap();
    let loss = report.loss();
    println!("MEASURED: upgrade: {}", loss.describe());
    if let Err(why) = loss.check() {
        // Where they went: the new run's counters name any drop reason.
        let stats = std::process::Command::new(rocev2_bin())
            .args(["stats", "--pin-dir", lab.pin_dir().to_str().unwrap()])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        panic!("the upgrade: {why}\n{}\n{}\n{stats}", report.render(), lab.link_drops());
    }
    let mut upgrade = upgrade;
    upgrade.signal(libc::SIGTERM);
    assert!(upgrade.wait(Duration::from_secs(10)).success(), "{}", upgrade.output());
    assert!(!lab.pin_dir().exists(), "a normal stop of the new run detaches and unpins");
}

/// Takes uplink 2's far end down under `rocev2 run` with these extra
/// arguments and environment, waits until u2 has left its group and one
/// neighbour refresh has passed, stops, and returns everything it printed.
fn output_around_a_member_failure(args: &[&str], env: &[(&str, &str)]) -> String {
    let lab = EcmpLab::create(2).unwrap();
    let config = lab.write_config("qp").unwrap();
    let mut full = vec!["--netns", lab.switch.name()];
    full.extend_from_slice(args);
    full.extend_from_slice(&["run", "--config", config.to_str().unwrap()]);
    let mut daemon = Daemon::start_with(&full, None, env);
    daemon.wait_for("rocev2: ready", Duration::from_secs(30));
    lab.uplinks[1].exec(&["ip", "link", "set", "up0", "down"]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while RunState::read(&lab.pin_dir()).map(|s| s.groups[0].members.len()).unwrap_or(0) != 1 {
        assert!(Instant::now() < deadline, "u2 did not leave its group:\n{}", daemon.output());
        std::thread::sleep(Duration::from_millis(20));
    }
    // neighbour_refresh_ms is 1000: let one refresh see the dead member too.
    std::thread::sleep(Duration::from_millis(1500));
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait(Duration::from_secs(10)).success(), "{}", daemon.output());
    daemon.output()
}

#[test]
fn a_member_going_down_is_one_warning_line_naming_group_member_and_reason() {
    require_root();
    // Text (not a terminal: no timestamps, journald adds them).
    let text = output_around_a_member_failure(&[], &[]);
    let warnings: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("WARN")).collect();
    assert_eq!(warnings.len(), 1, "one warning:\n{text}");
    let w = warnings[0];
    // Said once: the message has every fact, no `group="spines"` after it.
    assert_eq!(w, " WARN member u2 via fd00:2::2 left group spines: no carrier", "{w}");
    assert!(text.lines().any(|l| l.trim_start().starts_with("INFO") && l.contains("forwarding on p0")), "{text}");
    assert!(text.lines().any(|l| l == "rocev2: ready"), "the ready line stays plain on stdout:\n{text}");

    // JSON: one object per line, the facts as fields.
    let json = output_around_a_member_failure(&["--log-format", "json"], &[]);
    let events: Vec<serde_json::Value> = json
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(events.iter().any(|e| e["level"] == "INFO"), "{json}");
    let warnings: Vec<&serde_json::Value> = events.iter().filter(|e| e["level"] == "WARN").collect();
    assert_eq!(warnings.len(), 1, "one warning:\n{json}");
    let w = warnings[0];
    assert_eq!((w["group"].as_str(), w["member"].as_str()), (Some("spines"), Some("u2")), "{w}");
    assert_eq!((w["next_hop"].as_str(), w["reason"].as_str()), (Some("fd00:2::2"), Some("no carrier")), "{w}");
    // The line that says the dataplane is up has its facts as fields too.
    let up = events.iter().find(|e| e["message"].as_str().is_some_and(|m| m.starts_with("forwarding on"))).unwrap();
    assert_eq!((up["ports"].as_str(), up["attach"].as_str()), (Some("p0"), Some("native XDP")), "{up}");
    assert_eq!((up["groups"].as_u64(), up["routes"].as_u64()), (Some(1), Some(2)), "{up}");
    assert!(up["pin_dir"].as_str().is_some_and(|p| p.starts_with("/sys/fs/bpf/")), "{up}");
    assert!(w["timestamp"].is_string() && w["message"].as_str().unwrap().contains("left group spines"), "{w}");
}

#[test]
fn rust_log_warn_hides_info_lines_but_not_the_warning() {
    require_root();
    let out = output_around_a_member_failure(&[], &[("RUST_LOG", "warn")]);
    assert!(!out.lines().any(|l| l.contains("INFO")), "RUST_LOG=warn shows no info lines:\n{out}");
    assert_eq!(out.lines().filter(|l| l.trim_start().starts_with("WARN")).count(), 1, "{out}");
    assert!(out.lines().any(|l| l == "rocev2: ready"), "{out}");
    // --log-level wins over RUST_LOG.
    let out = output_around_a_member_failure(&["--log-level", "error"], &[("RUST_LOG", "info")]);
    assert!(!out.lines().any(|l| l.contains("INFO") || l.contains("WARN")), "--log-level error:\n{out}");
}

/// The systemd branch of `rocev2 upgrade`, with a stand-in `systemctl`
/// first on PATH (no systemd runs here): after the handover it runs
/// `systemctl start <unit>` exactly once, and what that starts takes over.
/// The stand-in starts `rocev2 run` the way the unit's ExecStart would.
#[test]
fn upgrade_under_systemd_starts_the_unit_after_the_handover() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let config = lab.write_config("qp").unwrap();
    let old = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let old_pid = RunState::read(&lab.pin_dir()).unwrap().pid;

    struct Cleanup {
        dir: PathBuf,
        pin_dir: PathBuf,
        old_pid: u32,
    }
    impl Drop for Cleanup {
        fn drop(&mut self) {
            // Whatever the stand-in started: stop it (SIGTERM detaches).
            if let Ok(state) = RunState::read(&self.pin_dir) {
                if state.pid != self.old_pid {
                    // SAFETY: kill(2) on the run this test started.
                    unsafe { libc::kill(state.pid as i32, libc::SIGTERM) };
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while self.pin_dir.exists() && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
    let dir = PathBuf::from(format!("/tmp/rocev2-fake-systemctl-{}", lab.tag));
    std::fs::create_dir_all(&dir).unwrap();
    let cleanup = Cleanup { dir: dir.clone(), pin_dir: lab.pin_dir(), old_pid };
    let script = format!(
        "#!/bin/sh\necho \"$@\" >> {dir}/calls\nsetsid {bin} --netns {ns} run --config {config} > {dir}/run.log 2>&1 < /dev/null &\n",
        dir = dir.display(),
        bin = rocev2_bin().canonicalize().unwrap().display(),
        ns = lab.switch.name(),
        config = config.display()
    );
    let systemctl = dir.join("systemctl");
    std::fs::write(&systemctl, script).unwrap();
    std::fs::set_permissions(&systemctl, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(rocev2_bin())
        .args(["upgrade", "--pin-dir", lab.pin_dir().to_str().unwrap(), "--unit", "rocev2-test.service"])
        .env("PATH", path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("rocev2: pid {old_pid} handed over")), "{stdout}");
    assert!(stdout.contains("rocev2: started rocev2-test.service: rocev2 0.1.0 (commit "), "{stdout}");
    let old_output = old.stop_after_exit(Duration::from_secs(10)).unwrap();
    assert!(old_output.contains("handed over"), "{old_output}");
    assert_eq!(std::fs::read_to_string(dir.join("calls")).unwrap(), "start rocev2-test.service\n");

    let deadline = Instant::now() + Duration::from_secs(60);
    let log = || std::fs::read_to_string(dir.join("run.log")).unwrap_or_default();
    while !log().contains("rocev2: ready") {
        assert!(Instant::now() < deadline, "the started run did not become ready:\n{}", log());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(log().contains("took over p0"), "{}", log());
    assert_ne!(RunState::read(&lab.pin_dir()).unwrap().pid, old_pid);
    drop(cleanup);
    assert!(!lab.pin_dir().exists(), "the new run stopped cleanly:\n{}", log());
}

/// A table filling up is one warning with the numbers and what to do: here
/// the flowlet table of a 16,384-flow group, sent 20,000 QPs.
#[test]
fn a_flowlet_table_filling_up_is_one_warning_line() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let text = lab.config("qp").replace(
        "name = \"spines\"\n",
        "name = \"spines\"\npolicy = \"flowlet\"\nflowlet_gap_us = 5000\nflowlet_table_size = 16384\n",
    );
    assert!(text.contains("flowlet_table_size"), "{text}");
    let config = lab.write_config_text("flowlet-fill", &text).unwrap();
    let mut daemon = Daemon::start(
        &["--netns", lab.switch.name(), "--log-format", "json", "run", "--config", config.to_str().unwrap()],
        None,
    );
    daemon.wait_for("rocev2: ready", Duration::from_secs(30));
    let frames: Vec<Vec<u8>> =
        (0..20_000u32).map(|q| lab_frame(Family::V4, Bth::new(opcode::SEND_ONLY, 0x1000 + q, 0), 2, 64)).collect();
    let report = lab.send_bursts_and_capture(vec![frames], Duration::ZERO).unwrap();
    assert!(report.received() > 0, "{}", report.render());
    // The check runs with the STATUS= refresh, every 10 s.
    daemon.wait_for("flowlet table is", Duration::from_secs(15));
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait(Duration::from_secs(10)).success(), "{}", daemon.output());
    let output = daemon.output();
    let warnings: Vec<serde_json::Value> = output
        .lines()
        .filter(|l| l.starts_with('{') && l.contains("flowlet table"))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(warnings.len(), 1, "one line:\n{output}");
    let w = &warnings[0];
    assert_eq!((w["level"].as_str(), w["table"].as_str()), (Some("WARN"), Some("flowlet table")), "{w}");
    assert_eq!(w["capacity"], 16384, "{w}");
    assert!(w["used"].as_u64().unwrap() >= 14_746, "{w}");
    assert!(w["message"].as_str().unwrap().contains("raise flowlet_table_size"), "{w}");
}
