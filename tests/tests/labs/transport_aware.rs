//! Transport-aware member choice end to end: a real `rocev2 run` switch
//! with two uplinks in a flowlet group with `transport_aware`, RC traffic
//! (`gen --rc` requester, an RC responder reachable over both uplinks, as a
//! host behind two spines is), and a faulty uplink: the lab's fault
//! injector drops PSNs on its far end. The switch must demote that uplink
//! from the NAKs and retransmissions of the QPs it carries, send new
//! flowlets to the other one, and give it its buckets back once the fault
//! is gone and its score has decayed.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use rocev2_common::{bth::opcode, buckets::BucketTable, flowlet::FlowletChoice, hash::HashMode};
use rocev2_tests::{
    book,
    fixture::{bth, group_members, loopback_dataplane, roce_spec},
    require_root, rocev2_bin, test_run, XDP_REDIRECT,
};
use rocev2_user::{
    control::config::{FlowletConfig, Policy, Prefix},
    control::dataplane::GroupPolicy,
    control::qp_telemetry,
    sys::netns::in_netns,
    sys::rawsock::PacketSocket,
    testbed::ecmp_lab::{uplink_mac, DataplaneProcess, EcmpLab, DEST_V4, RC_HOSTS},
    testbed::fault::PsnDropper,
    tools::packet::{build_roce_frame, parse_roce, RoceFrameSpec},
    tools::rc::{self, RequesterReport, Responder, ResponderQpReport},
};

const QPS: u32 = 16;
const MESSAGES: u32 = 16;
const MESSAGE_PACKETS: u32 = 4;
const PSNS: u32 = MESSAGES * MESSAGE_PACKETS;
/// Each round's QPs are new (DestQP ROUND_QPS[i]..+QPS): new flows.
const ROUND_QPS: [u32; 3] = [0x100, 0x200, 0x300];
/// PSNs of every round-1 and round-2 QP the faulty uplink drops (once each).
const DROPPED_PSNS: [u32; 4] = [8, 24, 40, 56];
const DEMOTE_ABOVE: f64 = 10.0;
/// Longer than any pause in a round (the requester's ACK timeout is 50
/// ms): flows move only when an ACK leaves nothing in flight.
const GAP_US: u32 = 100_000;
const RESTORE_BELOW: f64 = 1.0;

/// The option under test.
fn transport_aware() -> String {
    format!(
        "transport_aware = {{ demote_above = {DEMOTE_ABOVE}, restore_below = {RESTORE_BELOW}, half_life_ms = 1000, repick = \"idle-or-acked\" }}\n"
    )
}

/// The lab's switch with routes learned from the kernel, and a transport-aware
/// flowlet `[[route_policy]]` for the uplinks' prefix.
fn kernel_config(lab: &EcmpLab) -> String {
    format!(
        "[dataplane]\nhash = \"qp\"\nhash_seed = 1234\nxdp_mode = \"native\"\npin_dir = \"{pin}\"\nneighbour_refresh_ms = 1000\ntelemetry_qps = 1024\n\n[[port]]\nname = \"p0\"\n\n[[port]]\nname = \"u1\"\n\n[[port]]\nname = \"u2\"\n\n[routing]\nsource = \"kernel\"\n\n[[route_policy]]\nprefix = \"10.1.0.0/16\"\npolicy = \"flowlet\"\nflowlet_gap_us = {GAP_US}\n{ta}\n{RC_HOSTS}",
        pin = lab.pin_dir().display(),
        ta = transport_aware(),
    )
}

/// The lab's config with a way back for the replies (from u1/u2 to p0),
/// telemetry, and the spines group as a transport-aware flowlet group.
fn config(lab: &EcmpLab) -> String {
    let base = lab.rc_config("qp");
    let base = base.replace(
        "[[group]]\nname = \"spines\"\n",
        &format!(
            "[[group]]\nname = \"spines\"\npolicy = \"flowlet\"\nflowlet_gap_us = {GAP_US}\n{}",
            transport_aware()
        ),
    );
    assert!(base.contains("transport_aware"), "{base}");
    base
}

/// One RC responder behind both uplinks (a packet socket on each uplink's
/// far end): it answers on the uplink the QP's latest data came in on.
struct DualHomedResponder {
    stop: Arc<AtomicBool>,
    thread: thread::JoinHandle<anyhow::Result<Vec<ResponderQpReport>>>,
}

impl DualHomedResponder {
    fn start(lab: &EcmpLab) -> Self {
        let sockets: Vec<(PacketSocket, [u8; 6])> = lab
            .uplinks
            .iter()
            .enumerate()
            .map(|(i, ns)| (in_netns(ns.name(), || Ok(PacketSocket::open("up0")?)).unwrap(), uplink_mac(i + 1)))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = thread::spawn(move || {
            let mut responder = Responder::new(0, 8);
            let mut buf = vec![0u8; 65536];
            // A reply leaves on the uplink whose far end it comes from.
            let send = |frames: Vec<Vec<u8>>| -> anyhow::Result<()> {
                for f in frames {
                    let (socket, _) =
                        sockets.iter().find(|(_, mac)| f[6..12] == mac[..]).expect("a reply from an uplink");
                    socket.send(&f)?;
                }
                Ok(())
            };
            while !stopped.load(Ordering::Relaxed) {
                let mut any = false;
                for (socket, _) in &sockets {
                    while let Some(n) = socket.recv(&mut buf, Duration::ZERO)? {
                        any = true;
                        if let Ok(p) = parse_roce(&buf[..n]) {
                            send(responder.frame(&p))?;
                        }
                    }
                }
                if !any {
                    send(responder.flush())?;
                    thread::sleep(Duration::from_micros(200));
                }
            }
            Ok(responder.report())
        });
        Self { stop, thread }
    }

    fn finish(self) -> Vec<ResponderQpReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap().expect("responder")
    }
}

/// A round of `gen --rc`: QPS new QPs from `first_qp`, every PSN delivered.
fn round(lab: &EcmpLab, first_qp: u32) -> RequesterReport {
    let mut args = lab.rc_requester_args(QPS, first_qp);
    args.first_psn = 0;
    args.messages = MESSAGES;
    args.message_packets = MESSAGE_PACKETS;
    args.payload = 256;
    args.window = 8;
    args.ack_timeout_ms = 50;
    let report = in_netns(lab.sender.name(), move || rc::request(&args)).expect("requester");
    assert!(report.complete, "round from QP {first_qp:#x}:\n{}", report.render());
    report
}

fn stats(lab: &EcmpLab) -> serde_json::Value {
    let out = std::process::Command::new(rocev2_bin())
        .args(["stats", "--json", "--pin-dir"])
        .arg(lab.pin_dir())
        .output()
        .unwrap();
    assert!(out.status.success(), "rocev2 stats: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("stats JSON")
}

/// Member `dev` of `group` in `stats --json`.
fn member<'a>(stats: &'a serde_json::Value, group: &str, dev: &str) -> &'a serde_json::Value {
    let group = stats["groups"].as_array().unwrap().iter().find(|g| g["name"] == group).expect("the group");
    group["members"].as_array().unwrap().iter().find(|m| m["dev"] == dev).unwrap_or_else(|| panic!("{group:#}"))
}

fn packets(stats: &serde_json::Value, group: &str, dev: &str) -> u64 {
    member(stats, group, dev)["packets"].as_u64().unwrap()
}

/// The book's `rocev2 stats` outputs in "Transport-aware member choice",
/// one per `$ rocev2 stats` line of its first text block.
fn book_stats() -> Vec<Vec<String>> {
    let section = book::section("telemetry.md", "## Transport-aware member choice", "\n## ");
    let block = section.split("```text\n").nth(1).expect("a text block").split("```").next().unwrap();
    let mut outputs: Vec<Vec<String>> = Vec::new();
    for line in block.lines() {
        if line.starts_with("$ rocev2 stats") {
            outputs.push(Vec::new());
        } else if !line.is_empty() {
            outputs.last_mut().expect("a command first").push(line.to_string());
        }
    }
    outputs
}

/// `rocev2 stats` printed, and compared (numbers masked) with the
/// book's output `shown`.
fn check_stats_text(lab: &EcmpLab, when: &str, shown: &[String]) {
    let out =
        std::process::Command::new(rocev2_bin()).args(["stats", "--pin-dir"]).arg(lab.pin_dir()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("$ rocev2 stats   # {when}\n{text}");
    book::assert_shows(when, shown, &text, book::mask);
}

#[test]
fn a_faulty_uplink_is_demoted_avoided_and_restored_when_the_fault_is_gone() {
    require_root();
    let lab = EcmpLab::create(2).expect("build the lab");
    let config = lab.write_config_text("transport-aware", &config(&lab)).unwrap();
    demote_avoid_restore(&lab, &config, "spines", true);
}

/// The same with the uplinks learned from a kernel multipath route (what
/// FRR installs for BGP paths) under a `[[route_policy]]` with
/// `transport_aware`.
#[test]
fn a_learned_group_under_a_transport_aware_route_policy_does_the_same() {
    require_root();
    let lab = EcmpLab::create(2).expect("build the lab");
    let multipath = ["nexthop", "via", "10.0.1.2", "dev", "u1", "nexthop", "via", "10.0.2.2", "dev", "u2"];
    lab.in_switch(&[&["ip", "route", "add", "10.1.0.0/16"][..], &multipath[..]].concat()).expect("the multipath route");
    let config = lab.write_config_text("transport-aware-learned", &kernel_config(&lab)).unwrap();
    demote_avoid_restore(&lab, &config, "nh:u1+u2", false);
}

/// Three rounds of new QPs: with PSNs dropped on u2's far end (u2 is
/// demoted; `rocev2 upgrade` then keeps it demoted), with the fault still
/// there (u2 avoided), after the fault is gone (u2 restored and used). `configured`: `group` is a config group,
/// and the book's output and `explain` are checked too.
fn demote_avoid_restore(lab: &EcmpLab, config: &std::path::Path, group: &str, configured: bool) {
    let mut dataplane = lab.start_dataplane(&rocev2_bin(), config).expect("start rocev2 run");
    let responder = DualHomedResponder::start(lab);

    // Uplink 2's far end drops chosen PSNs of the first two rounds' QPs.
    let drops: Vec<(u32, u32, u32)> = ROUND_QPS[..2]
        .iter()
        .flat_map(|first| (*first..*first + QPS).flat_map(|qp| DROPPED_PSNS.map(|psn| (qp, psn, 1))))
        .collect();
    let dropper = in_netns(lab.uplinks[1].name(), move || PsnDropper::attach("up0", &drops)).expect("fault injector");

    // Round 1: the QPs on u2 lose packets; their NAKs and resends demote it.
    let before = stats(lab);
    assert_eq!(member(&before, group, "u2")["health"]["demoted"], false, "{before:#}");
    let spines = before["groups"].as_array().unwrap().iter().find(|g| g["name"] == group).unwrap();
    let knobs = &spines["transport_aware"];
    assert_eq!(
        (knobs["demote_above"].as_f64(), knobs["restore_below"].as_f64()),
        (Some(DEMOTE_ABOVE), Some(RESTORE_BELOW))
    );
    assert_eq!(
        (knobs["half_life_ms"].as_u64(), knobs["repick"].as_str()),
        (Some(1000), Some("idle-or-acked")),
        "{spines:#}"
    );
    let first = round(lab, ROUND_QPS[0]);
    eprintln!("round 1:\n{}", first.render());
    assert!(first.sequence_naks > 0, "the fault caused no NAK:\n{}", first.render());
    thread::sleep(Duration::from_millis(300)); // a control-loop step or two
    let demoted = stats(lab);
    let shown = book_stats();
    assert_eq!(shown.len(), 2, "{shown:?}");
    if configured {
        check_stats_text(lab, "u2 demoted", &shown[0]);
    }
    let (u1, u2) = (&member(&demoted, group, "u1")["health"], &member(&demoted, group, "u2")["health"]);
    assert_eq!((u2["demoted"].as_bool(), u1["demoted"].as_bool()), (Some(true), Some(false)), "{demoted:#}");
    assert!(u2["demotions"].as_u64() >= Some(1), "{demoted:#}");
    assert!(u2["score"].as_f64().unwrap() > RESTORE_BELOW, "{demoted:#}");
    let u2_transport = &member(&demoted, group, "u2")["transport"];
    assert!(u2_transport["naks_sequence"].as_u64() > Some(0), "{demoted:#}");

    // `explain` reads the live bucket table: a new QP's flow goes to u1.
    for qp in (0x900..0x908u32).filter(|_| configured) {
        let out = std::process::Command::new(rocev2_bin())
            .args(["explain", "--config"])
            .arg(config)
            .args(["--src", "10.0.0.1", "--dst", DEST_V4, "--sport", "49152", "--qp", &qp.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        let member = text.lines().find(|l| l.trim_start().starts_with("member")).unwrap_or_else(|| panic!("{text}"));
        assert!(member.contains("dev u1 "), "QP {qp:#x} while u2 is demoted:\n{text}");
        assert!(text.contains("u2 (score ") && text.contains("is demoted for its transport health"), "{text}");
    }

    // `rocev2 upgrade` while u2 is demoted: the new run takes the
    // previous one's health over, so u2 stays demoted (no moment with its
    // buckets back) and the score decays on from where it was.
    let pid = || rocev2_user::control::state::RunState::read(&lab.pin_dir()).expect("the run's state").pid;
    let old_pid = pid();
    let mut upgrade = std::process::Command::new(rocev2_bin());
    upgrade.args(["upgrade", "--pin-dir", lab.pin_dir().to_str().unwrap()]);
    let old = std::mem::replace(&mut dataplane, DataplaneProcess::spawn(upgrade).expect("rocev2 upgrade"));
    let old_log = old.stop_after_exit(Duration::from_secs(10)).expect("the old run hands over");
    let upgraded = stats(lab);
    let u2 = &member(&upgraded, group, "u2")["health"];
    assert_eq!(u2["demoted"], true, "a demoted member stays demoted across an upgrade: {upgraded:#}");
    assert!(u2["score"].as_f64().unwrap() > RESTORE_BELOW && u2["demotions"].as_u64() >= Some(1), "{upgraded:#}");
    assert_eq!(member(&upgraded, group, "u1")["health"]["demoted"], false, "{upgraded:#}");
    let kept = format!("kept the transport health of group {group} from the previous run: 1 member(s) demoted");
    assert!(dataplane.output().contains(&kept), "{}", dataplane.output());
    println!("MEASURED: after the upgrade u2 is still demoted, score {}", u2["score"]);
    // The new run's counters start at zero: compare round 2 with them.
    let demoted = upgraded;
    assert_ne!(pid(), old_pid, "a new process runs the dataplane");

    // Round 2, the fault still there: every new flowlet avoids u2.
    let second = round(lab, ROUND_QPS[1]);
    let during = stats(lab);
    assert_eq!(member(&during, group, "u2")["health"]["demoted"], true, "still demoted: {during:#}");
    assert_eq!(packets(&during, group, "u2"), packets(&demoted, group, "u2"), "u2 carried new flowlets: {during:#}");
    assert_eq!(second.sequence_naks, 0, "no drop on the path taken:\n{}", second.render());
    assert!(packets(&during, group, "u1") >= packets(&demoted, group, "u1") + u64::from(QPS * PSNS), "{during:#}");
    let qps = qp_telemetry::read_qps(&lab.pin_dir()).expect("read the QP table");
    let round_two: Vec<_> = qps.iter().filter(|q| (ROUND_QPS[1]..ROUND_QPS[1] + QPS).contains(&q.dest_qp)).collect();
    assert_eq!(round_two.len(), QPS as usize);
    assert!(round_two.iter().all(|q| q.stats.position == 0), "round 2 QPs on u1 only: {round_two:?}");

    // The fault goes; with no new trouble u2's score decays below
    // restore_below and it gets its buckets back.
    drop(dropper);
    let started = Instant::now();
    let restored = loop {
        let now = stats(lab);
        if member(&now, group, "u2")["health"]["demoted"] == false {
            break now;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "u2 never restored: {now:#}");
        thread::sleep(Duration::from_millis(200));
    };
    if configured {
        check_stats_text(lab, "u2 restored", &shown[1]);
    }
    let u2 = &member(&restored, group, "u2")["health"];
    assert!(u2["score"].as_f64().unwrap() < RESTORE_BELOW, "{restored:#}");
    assert!(u2["restores"].as_u64() >= Some(1), "{restored:#}");
    assert_eq!(u2["restores"], u2["demotions"], "every demotion undone: {restored:#}");

    // Round 3: new flowlets use u2 again.
    let third = round(lab, ROUND_QPS[2]);
    let after = stats(lab);
    assert!(packets(&after, group, "u2") > packets(&restored, group, "u2"), "u2 carries traffic again: {after:#}");
    assert!(packets(&after, group, "u1") > packets(&restored, group, "u1"), "{after:#}");
    // They moved between members with no idle gap (an ACK of everything
    // in flight ended their flowlets), and never overtook themselves: not
    // one NAK.
    assert_eq!(third.sequence_naks, 0, "{}", third.render());
    let qps = qp_telemetry::read_qps(&lab.pin_dir()).expect("read the QP table");
    let moves: u64 = qps
        .iter()
        .filter(|q| (ROUND_QPS[2]..ROUND_QPS[2] + QPS).contains(&q.dest_qp))
        .map(|q| q.stats.member_changes)
        .sum();
    assert!(moves > 0, "round 3 QPs moved: {qps:?}");
    let repicks = |dev| member(&after, group, dev)["transport"]["acked_repicks"].as_u64().unwrap();
    assert!(repicks("u1") + repicks("u2") > 0, "{after:#}");

    // The same in the metrics (per member, never per QP).
    let metrics = rocev2_user::control::metrics::scrape(&lab.pin_dir()).expect("scrape the metrics");
    let sample = |name: &str, dev: &str| -> f64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(&format!("member=\"{dev}\"")))
            .unwrap_or_else(|| panic!("no {name} for {dev}:\n{metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(sample("rocev2_member_demotions_total", "u2") >= 1.0);
    assert_eq!(sample("rocev2_member_restores_total", "u2"), sample("rocev2_member_demotions_total", "u2"));
    assert_eq!(sample("rocev2_member_demoted", "u2"), 0.0);
    assert_eq!(sample("rocev2_member_demotions_total", "u1"), 0.0);
    assert!(sample("rocev2_member_health_score", "u2") < RESTORE_BELOW);
    assert!(sample("rocev2_member_acked_repicks_total", "u1") >= 1.0);
    assert!(!metrics.contains("qp="), "per-QP labels in the metrics");
    assert!(
        metrics.lines().any(|l| l.starts_with(&format!("rocev2_group_policy{{group=\"{group}\""))
            && l.contains("repick=\"idle-or-acked\"")),
        "{metrics}"
    );

    let responded = responder.finish();
    let log = old_log + &dataplane.stop().expect("rocev2 run stops cleanly");
    // Every QP of every round delivered whole, in order, by the one responder.
    assert_eq!(responded.len(), 3 * QPS as usize, "{responded:?}");
    for r in &responded {
        assert_eq!((r.delivered, r.next_psn), (u64::from(PSNS), PSNS), "{r:?}");
    }
    // One log line per demotion and restore.
    for line in log.lines().filter(|l| l.contains(&format!("of group {group}"))) {
        eprintln!("{line}");
    }
    assert!(log.contains(&format!("member u2 of group {group} demoted")), "{log}");
    assert!(log.contains(&format!("member u2 of group {group} restored")), "{log}");
    assert!(!log.contains(&format!("member u1 of group {group} demoted")), "{log}");
}

/// A demotion or restore changes bucket owners only, and `rocev2 run`
/// writes it into the live bucket table in place: the group keeps its
/// generation, so a flow in the middle of a flowlet keeps its member (even
/// the demoted one) and only new flowlets read the new owners.
#[test]
fn a_bucket_only_change_keeps_running_flowlets_on_their_member() {
    let mut dp = loopback_dataplane();
    let flowlet = FlowletConfig {
        gap: Duration::from_secs(10),
        choice: FlowletChoice::Rehash,
        at_message_boundary: false,
        table_size: 1024,
        table: rocev2_common::flowlet::FlowletTable::Keyed,
    };
    let generation = dp
        .maps
        .publish_group_with(0, &GroupPolicy::new(HashMode::Qp, &Policy::Flowlet(flowlet), None), &group_members(0, 2))
        .unwrap();
    let prefix = Prefix::V4 { addr: "10.1.0.0".parse().unwrap(), len: 16 };
    dp.sync_routes(&[(prefix, 0)].into()).unwrap();
    let (src, dst) = ("10.0.0.1".parse().unwrap(), "10.1.0.9".parse().unwrap());
    let member_of = |dp: &mut rocev2_user::control::dataplane::Dataplane, qp: u32| {
        let frame = build_roce_frame(&RoceFrameSpec {
            src_port: 0xC000,
            ..roce_spec(src, dst, 64, bth(opcode::SEND_ONLY, qp, 1))
        });
        let run = test_run(dp, &frame).unwrap();
        assert_eq!(run.action, XDP_REDIRECT, "qp {qp:#x}");
        run.output[5]
    };
    let before: Vec<u8> = (0x100..0x120).map(|qp| member_of(&mut dp, qp)).collect();
    assert!(before.contains(&1), "some flows on member 1: {before:?}");
    // Member 1 demoted: every bucket to member 0.
    let entry = dp.maps.group(0).unwrap();
    assert_eq!(dp.maps.set_live_buckets(0, &[0; 256]).unwrap(), generation);
    let after = dp.maps.group(0).unwrap();
    assert_eq!((after.generation, after.bank, after.member_count), (entry.generation, entry.bank, entry.member_count));
    assert_eq!(dp.maps.bucket_table(0).unwrap(), [0u8; 256] as BucketTable);
    // Running flowlets keep their member; new flows all take member 0.
    let again: Vec<u8> = (0x100..0x120).map(|qp| member_of(&mut dp, qp)).collect();
    assert_eq!(again, before);
    assert!((0x200..0x240).all(|qp| member_of(&mut dp, qp) == 0));
    // A table naming a member the group does not have is refused.
    assert!(dp.maps.set_live_buckets(0, &[2; 256]).is_err());
}
