//! What a new user runs into in the first hour: a command without
//! privileges names the missing one, `check` finds a missing interface in
//! the namespace it is given, a mistyped `--netns` gets a suggestion, and
//! `stats` shows each group's policy. Each test makes its own lab.

use std::{
    path::Path,
    process::{Command, Output},
    time::Duration,
};

use rocev2_tests::{book, require_root, rocev2_bin, LabGuard};
use rocev2_user::testbed::ecmp_lab::EcmpLab;

fn rocev2(args: &[&str]) -> Output {
    Command::new(rocev2_bin()).args(args).output().expect("run rocev2")
}

/// `rocev2 ARGS` as user nobody with no capabilities.
fn rocev2_as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(rocev2_bin())
        .args(args)
        .output()
        .expect("setpriv (util-linux) runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn make_readable(config: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(config.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(config, std::fs::Permissions::from_mode(0o644)).unwrap();
}

#[test]
fn without_privileges_stats_and_lab_up_name_what_is_missing() {
    require_root();
    let lab = EcmpLab::create(1).unwrap();
    let config = lab.write_config("qp").unwrap();
    make_readable(&config);
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let pin_dir = lab.pin_dir().display().to_string();

    // While `run` runs: the problem is the privilege, not a missing `run`.
    for args in [vec!["stats", "--pin-dir", &pin_dir], vec!["stats", "--config", config.to_str().unwrap()]] {
        let out = rocev2_as_nobody(&args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} as nobody succeeded: {err}");
        assert!(err.contains("`rocev2 stats` needs CAP_DAC_OVERRIDE"), "{args:?}: {err}");
        assert!(err.contains(&pin_dir) && err.contains("run it as root"), "{args:?}: {err}");
        assert!(err.contains("setcap cap_dac_override+ep"), "how to grant it: {err}");
        assert!(!err.contains("is `rocev2 run` running"), "{args:?}: {err}");
    }
    // As root the same command works, so the message above was about privileges.
    let out = rocev2(&["stats", "--pin-dir", &pin_dir]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    dataplane.stop().unwrap();

    let name = format!("p{}", std::process::id() % 10_000_000);
    let _guard = LabGuard(name.clone());
    let out = rocev2_as_nobody(&["lab", "up", "--name", &name]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "lab up as nobody succeeded: {err}");
    assert!(err.contains("`rocev2 lab up` needs CAP_SYS_ADMIN and CAP_NET_ADMIN"), "{err}");
    assert!(err.contains("network namespaces") && err.contains("run it as root"), "{err}");
    assert!(!err.contains("os error"), "a bare errno instead of the privilege: {err}");
    let listed = text(&Command::new("ip").args(["netns", "list"]).output().unwrap().stdout);
    assert!(!listed.contains(&format!("{name}-rtsw")), "nothing was made: {listed}");
}

#[test]
fn check_looks_for_interfaces_in_the_namespace_it_is_given() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let good = lab.write_config("qp").unwrap();
    let sw = lab.switch.name();

    // In the switch's namespace every interface is there.
    let out = rocev2(&["--netns", sw, "check", "--config", good.to_str().unwrap()]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(said.contains(": OK (1 ports, 1 groups, 2 members, 2 routes;"), "{said}");
    assert!(said.contains(&format!("interfaces found in network namespace \"{sw}\"")), "{said}");

    // In the host's namespace they are not: the error says where it looked.
    let out = rocev2(&["check", "--config", good.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "check found the lab's p0 outside the lab: {}", text(&out.stdout));
    assert!(err.contains("port[0].name: no interface named p0"), "{err}");
    // (The host's, or in a container the one rocev2 was started in.)
    assert!(err.contains("; looked in the ") && err.contains("--netns NAME"), "{err}");

    // A member that does not exist, in the namespace that is right.
    let bad = lab.config("qp").replace("dev = \"u2\"", "dev = \"u9\"");
    let line = bad.lines().position(|l| l.contains("u9")).unwrap() + 1;
    let bad = lab.write_config_text("bad", &bad).unwrap();
    let out = rocev2(&["--netns", sw, "check", "--config", bad.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "check accepted a missing interface: {}", text(&out.stdout));
    assert!(err.contains(&format!("{}:{line}:", bad.display())), "file and line: {err}");
    assert!(err.contains("group[0].members[1].dev: no interface named u9"), "{err}");
    assert!(err.contains(&format!("looked in network namespace \"{sw}\" (`ip -n {sw} link`")), "{err}");

    // `run` says the same.
    let out = rocev2(&["--netns", sw, "run", "--config", bad.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("looked in network namespace \"{sw}\"")), "{err}");

    // --offline checks the file only.
    let out = rocev2(&["check", "--offline", "--config", bad.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("interfaces not looked up (--offline)"));

    // A mistyped namespace gets the close match.
    let typo = format!("{}x", &sw[..sw.len() - 1]);
    let out = rocev2(&["--netns", &typo, "check", "--config", good.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("network namespace \"{typo}\" not found")), "{err}");
    assert!(err.contains(&format!("did you mean \"{sw}\"?")), "{err}");
}

#[test]
fn stats_shows_each_groups_policy_and_knobs() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let flowlet = lab
        .config("qp")
        .replace("name = \"spines\"\n", "name = \"spines\"\npolicy = \"flowlet\"\nflowlet_gap_us = 500\n");
    assert!(flowlet.contains("flowlet_gap_us"), "the group section moved: {flowlet}");
    let config = lab.write_config_text("flowlet", &flowlet).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let pin_dir = lab.pin_dir().display().to_string();

    let out = rocev2(&["stats", "--pin-dir", &pin_dir]);
    let said = text(&out.stdout);
    let json = rocev2(&["stats", "--json", "--pin-dir", &pin_dir]);
    dataplane.stop().unwrap();

    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(said.contains("GROUP spines (hash qp, flowlet gap 500us)\n"), "{said}");
    assert!(json.status.success(), "{}", text(&json.stderr));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let group = &json["groups"][0];
    assert_eq!(group["policy"], "flowlet", "{json}");
    assert_eq!(group["flowlet"]["gap_us"], 500, "{json}");
    assert_eq!(group["flowlet"]["choice"], "rehash", "{json}");
}

/// What happens around one `rocev2 run`: a second run on its port is told
/// whose port it is; a pin_dir nothing uses lists the running instances
/// (`stats`, `top`, `trace`: none blames telemetry first);
/// a reload may turn flowlets off but not ECN on (naming the line); after
/// `kill -9` the orphan is reported, reload refuses, and `detach` removes
/// it; `run` under `ip netns exec` refuses to pin where nobody sees.
#[test]
fn a_dataplane_nobody_manages_is_reported_and_detach_removes_it() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let sw = lab.switch.name().to_string();
    let flowlet = lab
        .config("qp")
        .replace("name = \"spines\"\n", "name = \"spines\"\npolicy = \"flowlet\"\nflowlet_gap_us = 500\n");
    let config = lab.write_config_text("flowlet", &flowlet).unwrap();
    let cfg = config.to_str().unwrap().to_string();
    let pin_dir = lab.pin_dir().display().to_string();
    let first = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let pid = first.pid().expect("run's pid");

    // Another pin_dir, the same port: whose port it is.
    let other = lab.write_config_text("other", &flowlet.replace(&pin_dir, &format!("{pin_dir}-b"))).unwrap();
    let out = rocev2(&["--netns", &sw, "run", "--config", other.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            "p0 already carries the dataplane of another `rocev2 run` (pid {pid}, pin_dir {pin_dir}"
        )),
        "{err}"
    );
    assert!(!err.contains("driver may lack native XDP"), "{err}");

    // A pin_dir nothing uses: the running instances and their --pin-dir.
    let out = rocev2(&["stats", "--pin-dir", "/sys/fs/bpf/rocev2-nothing-here"]);
    let err = text(&out.stderr);
    assert!(err.contains("no `rocev2 run` is using pin_dir /sys/fs/bpf/rocev2-nothing-here"), "{err}");
    // Past nine, the eight started last are listed (sorted by pin_dir), then
    // how many more: runs other tests start later on a shared machine may
    // push this one out.
    let listed = err.lines().filter(|l| l.starts_with("  --pin-dir ")).count();
    let ours = format!("--pin-dir {pin_dir}  (pid {pid}, config {cfg}, --netns {sw})");
    let more = " started earlier (a state file each in /run/rocev2)";
    assert!(err.contains(&ours) || (listed == 8 && err.contains(more)), "{err}");
    assert!(!err.contains(".json"), "no state-file path: {err}");
    // `stats --watch` there waits (a run may be about to start) and lists
    // what runs meanwhile, as a mistyped pin_dir would wait for nothing.
    let mut watch = Command::new(rocev2_bin())
        .args(["stats", "--watch", "--interval", "0.2", "--pin-dir", "/sys/fs/bpf/rocev2-nothing-here"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let _ = watch.kill();
    let screen = text(&watch.wait_with_output().unwrap().stdout);
    assert!(screen.contains("waiting for a `rocev2 run` with this pin_dir to start"), "{screen}");
    assert!(screen.contains("running now (watch one with --pin-dir DIR or --config FILE):"), "{screen}");
    assert!(screen.contains(&ours) || screen.contains(more), "{screen}");
    // `top` and `trace` ask the same first, and only then about telemetry.
    for tool in ["top", "trace"] {
        let out = rocev2(&[tool, "--pin-dir", "/sys/fs/bpf/rocev2-nothing-here"]);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{tool}: {err}");
        assert!(err.contains("no `rocev2 run` is using pin_dir /sys/fs/bpf/rocev2-nothing-here"), "{tool}: {err}");
        assert!(!err.contains("runs without telemetry"), "{tool} blames telemetry where nothing runs: {err}");
        // This run has no telemetry: that is what they say about it (with
        // a bound on each, should it not refuse).
        let bound = if tool == "top" { ["--once", "--interval", "1"] } else { ["--duration", "1", "--json"] };
        let out = rocev2(&[&[tool, "--config", &cfg][..], &bound[..]].concat());
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("the `rocev2 run` using {pin_dir} (pid {pid}, config {cfg}) runs without telemetry")),
            "{tool}: {err}"
        );
    }

    // Flowlets off is a subset of what is loaded: applied live.
    std::fs::write(&config, lab.config("qp")).unwrap();
    let out = rocev2(&["reload", "--config", &cfg]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&rocev2(&["stats", "--config", &cfg]).stdout).contains("GROUP spines (hash qp)\n"));
    // ECN on is not: the refusal names the line that asks for it.
    let ecn = format!("{}\n[[egress]]\ndev = \"u1\"\nrate = \"1Gbit\"\n", lab.config("qp"));
    std::fs::write(&config, &ecn).unwrap();
    let line = ecn.lines().position(|l| l == "[[egress]]").unwrap() + 1;
    let out = rocev2(&["reload", "--config", &cfg]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains(&format!("turns on ecn ([[egress]] on u1 (line {line}))")), "{err}");
    std::fs::write(&config, lab.config("qp")).unwrap();

    // kill -9: nobody manages it now, and everyone says so.
    // SAFETY: kill(2) on the run this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    let _ = first.stop_after_exit(Duration::from_secs(10));
    let stats = text(&rocev2(&["stats", "--config", &cfg]).stdout);
    assert!(
        stats.starts_with(&format!("WARNING: no `rocev2 run` has managed the dataplane in {pin_dir} since ")),
        "{stats}"
    );
    assert!(
        stats.contains(&format!("(pid {pid} is gone: killed or crashed)")) && stats.contains("rocev2 detach"),
        "{stats}"
    );
    let out = rocev2(&["reload", "--config", &cfg]);
    assert!(!out.status.success() && text(&out.stderr).contains("nothing to reload"), "{}", text(&out.stderr));
    assert!(lab.in_switch(&["ip", "link", "show", "p0"]).unwrap().contains("xdp"), "the orphan still forwards");

    // detach: the program off the port, the pins and the state gone.
    let out = rocev2(&["detach", "--config", &cfg]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(&format!("rocev2: detached from p0; removed {pin_dir} and its state")),
        "{}",
        text(&out.stdout)
    );
    // Its final counters do not tell the user to run the detach they ran.
    assert!(!text(&out.stdout).contains("WARNING"), "{}", text(&out.stdout));
    assert!(!lab.in_switch(&["ip", "link", "show", "p0"]).unwrap().contains("xdp"), "p0 still has XDP");
    assert!(!Path::new(&pin_dir).exists());
    let out = rocev2(&["detach", "--config", &cfg]);
    assert!(!out.status.success() && text(&out.stderr).contains("nothing to detach"), "{}", text(&out.stderr));
    // explain, with nothing on the config's pin_dir, says so (it has no
    // --pin-dir to pick another instance with).
    let out = rocev2(&["explain", "--config", &cfg, "--src", "10.0.0.1", "--dst", "10.1.0.1", "--qp", "256"]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{said}{}", text(&out.stderr));
    assert!(said.contains(&format!("why not live: no `rocev2 run` uses this config's pin_dir {pin_dir}")), "{said}");
    assert!(!said.contains("--pin-dir DIR"), "{said}");

    // Under `ip netns exec`: refused, with the --netns advice, nothing pinned.
    let out = Command::new("ip")
        .args(["netns", "exec", &sw])
        .arg(rocev2_bin())
        .args(["run", "--config", &cfg])
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("refusing to pin the dataplane") && err.contains("rocev2 --netns NAME run"), "{err}");
    assert!(!lab.in_switch(&["ip", "link", "show", "p0"]).unwrap().contains("xdp"), "nothing attached");
}

/// `check` lists every missing interface, not the first.
#[test]
fn check_reports_every_missing_interface_with_close_names() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let sw = lab.switch.name();
    let bad = lab.config("qp").replace("name = \"p0\"", "name = \"p9\"").replace("dev = \"u2\"", "dev = \"u7\"");
    let bad = lab.write_config_text("two-bad", &bad).unwrap();
    let out = rocev2(&["--netns", sw, "check", "--config", bad.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("port[0].name: no interface named p9 (did you mean p0?)"), "{err}");
    assert!(err.contains("group[0].members[1].dev: no interface named u7 (did you mean u"), "{err}");
    assert!(err.contains("2 interfaces are missing"), "{err}");
    // From the host: they all exist in the switch's namespace, which is
    // named. A port name only this lab has (other labs running at the same
    // time have p0, u1 and u2 too).
    let only_here = format!("fh{}", std::process::id() % 1_000_000);
    lab.in_switch(&["ip", "link", "add", &only_here, "type", "veth", "peer", "name", &format!("{only_here}b")])
        .unwrap();
    // u1 a port as well as a member: one interface, two places.
    let good = lab.config("qp").replace("name = \"p0\"", &format!("name = \"{only_here}\"\n\n[[port]]\nname = \"u1\""));
    let good = lab.write_config_text("only-here", &good).unwrap();
    let out = rocev2(&["check", "--config", good.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("they exist in network namespace \"{sw}\": give `rocev2 --netns {sw} ...`")),
        "{err}"
    );
    assert!(err.contains("3 interfaces are missing (named in 4 places)"), "{err}");
}

/// A child this test started, killed (by its pid) if the test fails first.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The commands of the Tools chapter's `fault`/`top` example, as the book
/// shows them (the `# ` prompt and trailing comments dropped), split into
/// words.
fn tools_example() -> Vec<Vec<String>> {
    let chapter = book::chapter("tools.md");
    let block = chapter
        .split("```console\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .find(|block| block.contains("--telemetry") && block.contains(" fault "))
        .expect("tools.md shows the fault/top example in a console block");
    block
        .lines()
        .map(|l| {
            let command = l.strip_prefix("# ").unwrap_or_else(|| panic!("a root command: {l:?}"));
            command.split(" # ").next().unwrap().split_whitespace().map(str::to_string).collect()
        })
        .collect()
}

/// The Tools chapter's example, replayed from the book: a fabric lab with
/// `--telemetry`, `sink --rc` and `fault` on a receiving host, `gen --rc`
/// on a sending one; the receiving leaf's `top` sees the go-back on the
/// QP that lost a PSN, as the text under it says. The test's own lab name
/// stands for `lab`, the leaf port's MAC the `ip` step printed for `MAC`;
/// `sink` and `fault` get a `--duration` so that a failure cannot leave
/// them running, `top` also `--json` to read its numbers.
#[test]
fn the_tools_fault_and_top_example_runs_on_a_fabric_lab_with_telemetry() {
    require_root();
    let name = format!("ft{:x}", std::process::id() % 0xFFFFF);
    let steps = tools_example();
    let words: Vec<String> = steps.iter().map(|s| s.iter().take(3).cloned().collect::<Vec<_>>().join(" ")).collect();
    #[rustfmt::skip]
    assert_eq!(words, ["rocev2 lab up", "rocev2 --netns lab-r2h1", "rocev2 --netns lab-r2h1", "ip -n lab-l1",
                       "rocev2 --netns lab-r1h1", "rocev2 top --once"], "the example's steps changed: {steps:?}");
    let ours = |step: &[String], mac: &str| -> Vec<String> {
        step.iter()
            .map(|w| match (w.strip_prefix("/run/rocev2/lab-lab/"), w.strip_prefix("lab-")) {
                (Some(file), _) => format!("/run/rocev2/lab-{name}/{file}"),
                (None, Some(host)) => format!("{name}-{host}"),
                _ if w == "MAC" => mac.to_string(),
                _ => w.clone(),
            })
            .collect()
    };
    let run = |step: &[String], extra: &[&str]| {
        Command::new(&step[0]).args(&step[1..]).args(extra).output().expect("run the step")
    };
    let spawn = |step: &[String], extra: &[&str]| {
        let mut command = Command::new(&step[0]);
        command.args(&step[1..]).args(extra).stdout(std::process::Stdio::piped());
        Child(command.spawn().expect("spawn"))
    };
    let rocev2_step = |i: usize, mac: &str| {
        let mut step = ours(&steps[i], mac);
        assert_eq!(step[0], "rocev2");
        step[0] = rocev2_bin().display().to_string();
        step
    };

    let out = run(&rocev2_step(0, ""), &["--name", &name]);
    let _lab = LabGuard(name.clone());
    let up = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{up}");
    let sink = spawn(&rocev2_step(1, ""), &["--duration", "60"]);
    let fault = spawn(&rocev2_step(2, ""), &["--duration", "60"]);
    // fault is in place once its program is on eth0.
    let receiver = format!("{name}-r2h1");
    let attached = (0..200).any(|_| {
        let link = Command::new("ip").args(["-n", &receiver, "link", "show", "eth0"]).output().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        text(&link.stdout).contains("xdp")
    });
    assert!(attached, "fault did not attach");
    // The hint for the example: which leaf port MAC a host sends to.
    let link = run(&ours(&steps[3], ""), &[]);
    let mac = text(&link.stdout).split_whitespace().nth(2).expect("h1's MAC").to_string();
    let gen = run(&rocev2_step(4, &mac), &[]);
    let report = text(&gen.stdout);
    assert!(gen.status.success(), "{report}{}", text(&gen.stderr));
    // "gen reports QP 0x100 with 27 packets retransmitted (PSNs 5 to 31,
    // go-back-N after one NAK)"
    let said = book::section("tools.md", "`gen` reports QP 0x100", "\n\n");
    assert!(said.contains("27 packets retransmitted (PSNs 5 to 31") && said.contains("one SEQ NAK"), "{said}");
    assert!(report.contains("4 QPs complete") && report.contains("1 sequence NAKs"), "{report}");
    assert!(report.contains("5..=31 (nak)"), "PSNs 5 to 31 resent after the NAK: {report}");
    let top = run(&rocev2_step(5, ""), &[]);
    assert!(top.status.success(), "{}", text(&top.stderr));
    assert!(text(&top.stdout).contains("GO-BACKS"), "{}", text(&top.stdout));
    let top = run(&rocev2_step(5, ""), &["--json"]);
    let json: serde_json::Value =
        serde_json::from_slice(&top.stdout).unwrap_or_else(|_| panic!("{}", text(&top.stderr)));
    let qps = json["qps"].as_array().expect("qps");
    let lost = qps.iter().find(|q| q["dest_qp"] == 0x100).unwrap_or_else(|| panic!("{json}"));
    assert_eq!(lost["psn_backward_jumps"], 1, "{json}");
    let naks: u64 = qps.iter().map(|q| q["naks_sequence"].as_u64().unwrap()).sum();
    assert_eq!(naks, 1, "{json}");
    drop((sink, fault));
}
