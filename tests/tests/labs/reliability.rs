//! Issue 6: the dataplane holds under change and failure. Each test runs a
//! steady stream through the real `rocev2 run` in a namespace lab and
//! counts sent against received.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use rocev2_common::bth::{opcode, Bth};
use rocev2_tests::{require_root, rocev2_bin};
use rocev2_user::{
    control::dataplane::{Dataplane, Maps},
    control::errors::{RefusalReason, ReloadRefused},
    control::run::request_reload,
    control::state::{state_path, ReloadOutcome, RunState},
    testbed::ecmp_lab::{lab_frame, DataplaneProcess, EcmpLab, Family, LabReport},
};

const UPLINKS: usize = 4;
/// Packets per second of the background stream. AF_PACKET from a debug
/// test binary; the rate the issue asks for (1 Mpps) is measured by the
/// benchmark, not here (see the book's "Guarantees").
const PPS: u64 = 20_000;

/// 64 QPs on one source port, so a `qp` group spreads them.
fn stream_frames() -> Vec<Vec<u8>> {
    (0..64u32)
        .map(|q| {
            let bth = Bth::new(opcode::WRITE_MIDDLE, 0x100 + q, 0);
            lab_frame(Family::V4, bth, 2, 256)
        })
        .collect()
}

fn assert_no_loss(lab: &EcmpLab, report: &LabReport, what: &str) {
    rocev2_tests::assert_no_switch_loss(report, &format!("{what}\n{}", lab.link_drops()));
}

fn rocev2(args: &[&str]) -> std::process::Output {
    Command::new(rocev2_bin()).args(args).output().expect("run rocev2")
}

fn member_count(lab: &EcmpLab) -> usize {
    RunState::read(&lab.pin_dir()).map(|s| s.groups[0].members.len()).unwrap_or(usize::MAX)
}

#[test]
fn reload_changes_members_and_routes_without_loss() {
    require_root();
    let lab = EcmpLab::create(UPLINKS).unwrap();
    let full = lab.config("qp");
    let config = lab.write_config_text("reload", &full).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let capture = lab.start_capture().unwrap();
    let stream = lab.start_stream(stream_frames(), PPS).unwrap();
    std::thread::sleep(Duration::from_millis(500));

    // Remove member u4, add an unrelated route, change the seed.
    let smaller =
        full.replace("  { dev = \"u4\", via = \"10.0.4.2\" },\n", "").replace("hash_seed = 1234", "hash_seed = 99")
            + "\n[[route]]\nprefix = \"10.9.0.0/16\"\ngroup = \"spines\"\n";
    assert_ne!(smaller, full, "the edit must change the config");
    std::fs::write(&config, &smaller).unwrap();
    let out = rocev2(&["reload", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "reload: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(member_count(&lab), UPLINKS - 1);
    std::thread::sleep(Duration::from_millis(500));

    // A broken config is refused and the running one stays.
    std::fs::write(&config, "[[port]]\nname = \"p0\"\n[[route]]\nprefix = \"10.1.0.0/16\"\ngroup = \"nope\"\n")
        .unwrap();
    let out = rocev2(&["reload", "--pin-dir", lab.pin_dir().to_str().unwrap()]);
    assert!(!out.status.success(), "a bad config must fail the reload");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no group named \"nope\"") && err.contains("running config stays"), "{err}");

    // And back to four members, by SIGHUP.
    std::fs::write(&config, &full).unwrap();
    let pid = RunState::read(&lab.pin_dir()).unwrap().pid;
    unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    let deadline = Instant::now() + Duration::from_secs(10);
    while member_count(&lab) != UPLINKS {
        assert!(Instant::now() < deadline, "SIGHUP reload did not restore the member");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let sent = stream.stop().unwrap();
    let report = capture.finish(sent).unwrap();
    // Its final counters say where a lost packet went (pass_*, drop_*).
    let output = dataplane.stop().unwrap();
    assert_no_loss(&lab, &report, &format!("reloads under traffic (rocev2 run said:\n{output}\n)"));
    assert!(report.uplinks[3].packets > 0, "u4 carried traffic before and after");
}

/// The one publish path (control::groups) under a reload that adds a
/// group, a route to it and a pin on it at once: the group is written
/// first, then the route, then the pin, which names the group's live
/// generation and the pinned member's position. Read from the map writes
/// `rocev2 run` logs as it makes them (`RUST_LOG=rocev2::maps=debug`),
/// then checked in the pinned maps and with packets that follow the pin.
#[test]
fn a_reload_writes_a_new_group_then_its_route_then_its_pin() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    // Pinned from the start: pins are a feature the programs load with.
    let base = lab.config("qp").replace("name = \"spines\"\n", "name = \"spines\"\npolicy = \"pinned\"\n");
    let config = lab.write_config_text("publish-order", &base).unwrap();
    let mut run = Command::new(rocev2_bin());
    run.args(["--netns", lab.switch.name(), "run", "--config"]).arg(&config);
    run.env("RUST_LOG", "info,rocev2::maps=debug");
    let dataplane = DataplaneProcess::spawn(run).unwrap();
    let before = dataplane.output().lines().count();

    // A pinned group on both uplinks, a route more specific than the
    // lab's (so the lab's destination takes it) and a pin on u2.
    let te = base
        + "\n[[group]]\nname = \"te\"\npolicy = \"pinned\"\nmembers = [\n  { dev = \"u1\", via = \"10.0.1.2\" },\n  { dev = \"u2\", via = \"fd00:2::2\" },\n]\n\n[[route]]\nprefix = \"10.1.0.0/24\"\ngroup = \"te\"\n\n[[pin]]\nprefix = \"10.1.0.1/32\"\nqp = 0x123\ngroup = \"te\"\nmember = \"u2\"\n";
    std::fs::write(&config, &te).unwrap();
    let out = rocev2(&["reload", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "reload: {}", String::from_utf8_lossy(&out.stderr));
    let state = RunState::read(&lab.pin_dir()).unwrap();
    let group = state.groups.iter().find(|g| g.name == "te").expect("group te in the state file");
    let (slot, u2) = (group.index, group.members.iter().position(|m| m.dev == "u2").expect("u2 usable") as u32);

    // The reload's map writes, in the order they were made.
    let pin_line = format!("pin 10.1.0.1/32 qp 0x123 -> group {slot} position {u2} generation ");
    let deadline = Instant::now() + Duration::from_secs(10);
    let writes: Vec<String> = loop {
        let lines: Vec<String> = dataplane.output().lines().skip(before).map(str::to_string).collect();
        if lines.iter().any(|l| l.contains(&pin_line)) {
            break lines;
        }
        assert!(Instant::now() < deadline, "no `{pin_line}` logged after the reload:\n{}", lines.join("\n"));
        std::thread::sleep(Duration::from_millis(20));
    };
    let at = |needle: &str| {
        writes
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no `{needle}` in the reload's map writes:\n{}", writes.join("\n")))
    };
    let group_written = at(&format!("group {slot}: 2 members"));
    let route_written = at(&format!("route 10.1.0.0/24 -> {slot}"));
    let pin_written = at(&pin_line);
    println!(
        "MEASURED: the reload's map writes, in order:\n{}\n{}\n{}",
        writes[group_written], writes[route_written], writes[pin_written]
    );
    assert!(
        group_written < route_written && route_written < pin_written,
        "group, then route, then pin:\n{}",
        writes.join("\n")
    );

    // The maps hold them, and the pin names the group's live generation.
    let maps = Maps::open_pinned(&lab.pin_dir()).unwrap();
    assert_eq!(maps.route_target("10.1.0.1".parse().unwrap()).unwrap(), Some(slot));
    let generation = maps.group(slot).unwrap().generation;
    assert!(writes[pin_written].ends_with(&format!("generation {generation}")), "{}", writes[pin_written]);

    // Packets of QP 0x123 follow the pin to u2.
    let frames: Vec<Vec<u8>> =
        (0..20).map(|psn| lab_frame(Family::V4, Bth::new(opcode::WRITE_MIDDLE, 0x123, psn), 2, 128)).collect();
    let report = lab.send_bursts_and_capture(vec![frames], Duration::ZERO).unwrap();
    let output = dataplane.stop().unwrap();
    assert_eq!(
        (report.uplinks[0].packets, report.uplinks[1].packets),
        (0, 20),
        "every packet on u2 (rocev2 run said:\n{output}\n)\n{}",
        report.render()
    );
}

#[test]
fn reload_refuses_a_flowlet_table_kind_the_programs_were_loaded_without() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let keyed = lab.config("qp").replace("name = \"spines\"\n", "name = \"spines\"\npolicy = \"flowlet\"\n");
    let config = lab.write_config_text("flowlet", &keyed).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let keyless = keyed.replace("policy = \"flowlet\"\n", "policy = \"flowlet\"\nflowlet_table = \"keyless\"\n");
    std::fs::write(&config, &keyless).unwrap();
    let out = rocev2(&["reload", "--config", config.to_str().unwrap()]);
    assert!(!out.status.success(), "the keyless table was not loaded: the reload must be refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("flowlet-keyless") && err.contains("running config stays"), "{err}");
    // The state file says why, and `request_reload` returns it typed: a
    // restart would apply this file.
    let state = RunState::read(&lab.pin_dir()).unwrap();
    assert!(
        matches!(&state.last_reload, ReloadOutcome::Refused { reason: RefusalReason::FeaturesNotLoaded, .. }),
        "{:?}",
        state.last_reload
    );
    let err = request_reload(&lab.pin_dir(), Duration::from_secs(20)).unwrap_err();
    let refused = err.downcast_ref::<ReloadRefused>().expect("a typed refusal");
    assert!(refused.reason.restart_applies(), "{refused:?}");
    // A setting fixed at load time: refused as needing a restart, recorded
    // in the state file as the book shows it.
    std::fs::write(&config, keyed.replace("xdp_mode = \"native\"", "xdp_mode = \"skb\"")).unwrap();
    let err = request_reload(&lab.pin_dir(), Duration::from_secs(20)).unwrap_err();
    let refused = err.downcast_ref::<ReloadRefused>().expect("a typed refusal");
    assert_eq!(refused.reason, RefusalReason::NeedsRestart, "{refused:?}");
    let written = std::fs::read_to_string(state_path(&lab.pin_dir())).unwrap();
    let shown = "  \"last_reload\": {\n    \"outcome\": \"refused\",\n    \"reason\": \"needs-restart\",\n    \"message\": \"dataplane.xdp_mode changed; that needs a restart of `rocev2 run`\"\n  },";
    assert!(written.contains(shown), "{written}");
    let book = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/src/running.md")).unwrap();
    assert!(book.contains(shown), "the book shows what the state file holds:\n{shown}");
    let output = dataplane.stop().unwrap();
    // Only the keyed table's code was loaded.
    assert!(output.contains("programs loaded with features: flowlet-keyed, classes, counters"), "{output}");
}

#[test]
fn restart_with_handover_loses_nothing() {
    require_root();
    let lab = EcmpLab::create(UPLINKS).unwrap();
    let config = lab.write_config("qp").unwrap();
    let first = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let capture = lab.start_capture().unwrap();
    let stream = lab.start_stream(stream_frames(), PPS).unwrap();
    std::thread::sleep(Duration::from_millis(500));

    // SIGUSR1: the first run exits and leaves the dataplane forwarding.
    let pid = RunState::read(&lab.pin_dir()).unwrap().pid;
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    let output = first.stop_after_exit(Duration::from_secs(10)).unwrap();
    assert!(output.contains("handed over"), "{output}");
    std::thread::sleep(Duration::from_millis(500)); // forwarding with nobody running

    let second = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    assert!(second.output().contains("took over p0"), "{}", second.output());
    std::thread::sleep(Duration::from_millis(500));
    let sent = stream.stop().unwrap();
    let report = capture.finish(sent).unwrap();
    let output = second.stop().unwrap();
    assert_no_loss(&lab, &report, &format!("handover restart (rocev2 run said:\n{output}\n)"));

    // A normal stop detaches: no XDP program left on the port, no pins.
    let link = lab.in_switch(&["ip", "-d", "link", "show", "p0"]).unwrap();
    assert!(!link.contains("prog/xdp"), "XDP detached after a normal stop:\n{link}");
    assert!(!lab.pin_dir().exists(), "pins removed after a normal stop");
}

#[test]
fn a_failed_uplink_leaves_its_group_and_comes_back() {
    require_root();
    let lab = EcmpLab::create(UPLINKS).unwrap();
    let config = lab.write_config("qp").unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let stream = lab.start_stream(stream_frames(), PPS).unwrap();
    std::thread::sleep(Duration::from_millis(300));

    // The far end of uplink 2 goes down: u2 loses its carrier.
    let down_at = Instant::now();
    lab.uplinks[1].exec(&["ip", "link", "set", "up0", "down"]).unwrap();
    while member_count(&lab) != UPLINKS - 1 {
        assert!(down_at.elapsed() < Duration::from_secs(2), "member not removed within 2 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    let removed_after = down_at.elapsed();
    stream.stop().unwrap();

    // With u2 out, everything sent reaches the other three uplinks.
    let capture = lab.start_capture().unwrap();
    let counted = lab.start_stream(stream_frames(), PPS).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let sent = counted.stop().unwrap();
    let report = capture.finish(sent).unwrap();
    assert_no_loss(&lab, &report, "traffic after the failure");
    assert_eq!(report.uplinks[1].packets, 0, "nothing goes to the failed uplink");

    let up_at = Instant::now();
    lab.uplinks[1].exec(&["ip", "link", "set", "up0", "up"]).unwrap();
    while member_count(&lab) != UPLINKS {
        assert!(up_at.elapsed() < Duration::from_secs(5), "member not back within 5 s:\n{}", dataplane.output());
        std::thread::sleep(Duration::from_millis(5));
    }
    let back_after = up_at.elapsed();
    dataplane.stop().unwrap();
    println!(
        "MEASURED: uplink failure -> member removed in {} ms; link back -> member restored in {} ms",
        removed_after.as_millis(),
        back_after.as_millis()
    );
    assert!(removed_after < Duration::from_millis(500), "removal took {removed_after:?}");
}

#[test]
fn a_full_route_table_is_a_clear_error() {
    require_root();
    let mut dp = Dataplane::load(None).unwrap();
    let wanted: std::collections::BTreeMap<_, _> = (0..rocev2_common::maps::MAX_ROUTES_V4 + 1)
        .map(|i| {
            (
                rocev2_user::control::config::Prefix::V4 {
                    addr: std::net::Ipv4Addr::from(0x0A00_0000 + (i << 8)),
                    len: 24,
                },
                0u32,
            )
        })
        .collect();
    let err = dp.sync_routes(&wanted).expect_err("one route more than the table holds");
    let msg = format!("{err:#}");
    assert!(msg.contains("route table full: 131072 of 131072 IPv4 routes installed"), "{msg}");
    // A typed error a caller matches on, no downcast needed.
    assert!(
        matches!(err, rocev2_user::control::errors::DataplaneError::RouteTableFull { installed: 131_072, .. }),
        "a typed error callers can act on: {err:?}"
    );
}

#[test]
fn without_privileges_the_missing_capability_is_named() {
    require_root();
    let lab = EcmpLab::create(1).unwrap();
    let config = lab.write_config("qp").unwrap();
    std::fs::set_permissions(config.parent().unwrap(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&config, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(rocev2_bin())
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .expect("setpriv (util-linux) runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("CAP_BPF") && err.contains("CAP_NET_ADMIN"), "{err}");
}

#[test]
fn pins_are_root_only() {
    require_root();
    let lab = EcmpLab::create(1).unwrap();
    let config = lab.write_config("qp").unwrap();
    let dataplane: DataplaneProcess = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(lab.pin_dir()).unwrap().permissions());
    dataplane.stop().unwrap();
    assert_eq!(mode & 0o777, 0o700, "pin directory mode {mode:o}");
}

/// Jumbo frames (MTU 9000, and RoCE's usual 4096 MTU) cross the real
/// dataplane intact: the XDP program is multi-buffer aware.
#[test]
fn jumbo_frames_are_forwarded_intact() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let set_mtu = |ns: &rocev2_user::sys::netns::Netns, dev: &str| {
        ns.exec(&["ip", "link", "set", "dev", dev, "mtu", "9000"]).unwrap()
    };
    set_mtu(&lab.sender, "snd0");
    set_mtu(&lab.switch, "p0");
    for (i, up) in lab.uplinks.iter().enumerate() {
        set_mtu(&lab.switch, &format!("u{}", i + 1));
        set_mtu(up, "up0");
    }
    let config = lab.write_config("qp").unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let frames: Vec<Vec<u8>> = [4096usize, 8900]
        .iter()
        .flat_map(|payload| {
            (0..16u32).map(move |q| {
                let bth = Bth::new(opcode::WRITE_MIDDLE, 0x300 + q, q);
                lab_frame(Family::V4, bth, 2, *payload)
            })
        })
        .collect();
    let report = lab.send_bursts_and_capture(vec![frames], Duration::ZERO).unwrap();
    dataplane.stop().unwrap();
    assert_no_loss(&lab, &report, "jumbo frames");
    for u in &report.uplinks {
        assert_eq!((u.bad_icrc, u.bad_ipv4_checksum, u.bad_ttl), (0, 0, 0), "up{} intact", u.uplink);
    }
}

/// Mistakes only the running system can reveal still name the file, line,
/// key and a fix: an unknown interface stops `run`; a neighbour that never
/// answers leaves its member out with a warning, and the rest forwards.
#[test]
fn runtime_config_mistakes_name_file_line_key_and_fix() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let bad_dev = lab.config("qp").replace("dev = \"u2\"", "dev = \"u9\"");
    let config = lab.write_config_text("bad-dev", &bad_dev).unwrap();
    let out = Command::new(rocev2_bin())
        .args(["--netns", lab.switch.name(), "run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let line = bad_dev.lines().position(|l| l.contains("u9")).unwrap() + 1;
    assert!(!out.status.success());
    assert!(err.contains(&format!("{}:{line}:", config.display())), "file and line: {err}");
    assert!(
        err.contains("group[0].members[1].dev") && err.contains("no interface named \"u9\"")
            || err.contains("no interface named u9"),
        "key and problem: {err}"
    );
    let sw = lab.switch.name();
    assert!(
        err.contains(&format!("looked in network namespace \"{sw}\" (`ip -n {sw} link`")),
        "where and a fix: {err}"
    );

    let silent = lab.config("qp").replace("via = \"10.0.1.2\"", "via = \"10.0.1.99\"");
    let config = lab.write_config_text("silent", &silent).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let output = dataplane.stop().unwrap();
    let line = silent.lines().position(|l| l.contains("10.0.1.99")).unwrap() + 1;
    assert!(output.contains(&format!("{}:{line}: group[0].members[0].via", config.display())), "{output}");
    assert!(output.contains("did not answer") && output.contains("mac ="), "{output}");
}

/// Live frames are recycled by the kernel as they are: without the
/// generator restoring MACs and TTL, a frame's later trips arrived with the
/// TTL a forwarder had lowered and ended as TTL-expired (~1/63 got through).
/// Now every trip through the real dataplane is forwarded.
#[test]
fn live_frames_through_the_dataplane_are_all_forwarded() {
    use rocev2_user::tools::gen::{generate, GenArgs, GenMode};
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let config = lab.write_config("qp").unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    const SENT: u64 = 20_000;
    let mut args = GenArgs::new(
        "snd0",
        "02:52:32:00:00:fe",
        "10.0.0.1".parse().unwrap(),
        rocev2_user::testbed::ecmp_lab::DEST_V4.parse().unwrap(),
    );
    args.mode = GenMode::LiveFrames;
    args.qps = 16;
    args.count = Some(SENT);
    args.live_repeat = 2_000;
    let report = rocev2_user::sys::netns::in_netns(lab.sender.name(), move || generate(&args)).unwrap();
    assert_eq!(report.packets, SENT);
    std::thread::sleep(Duration::from_millis(300));
    let stats = rocev2(&["stats", "--json", "--pin-dir", lab.pin_dir().to_str().unwrap()]);
    dataplane.stop().unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    let counters = &stats["ports"][0]["counters"];
    let forwarded = counters["forwarded_roce"].as_u64().unwrap();
    let expired = counters["pass_ttl_expired"].as_u64().unwrap();
    println!("MEASURED: live frames: sent {SENT}, forwarded {forwarded}, TTL-expired {expired}");
    assert_eq!(expired, 0, "no recycled frame arrives with a lowered TTL");
    assert!(forwarded * 100 >= SENT * 99, "forwarded {forwarded} of {SENT}");
}
