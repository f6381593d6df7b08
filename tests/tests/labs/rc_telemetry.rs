//! RC transport end to end through a real `rocev2 run` switch: `gen --rc`
//! on the sender, `sink --rc` responders behind two uplinks, the lab's
//! fault injector dropping chosen PSNs on the uplinks' far ends (after the
//! switch) and on the sender's egress (before it). The requester must send
//! again exactly the NAKed ranges and every PSN must be delivered once, in
//! order; the switch's telemetry must see the NAKs and the retransmissions
//! on the QP and on the member its data took, and the gap of a PSN lost
//! before it.

use std::{sync::mpsc, time::Duration};

use rocev2_tests::{require_root, rocev2_bin};
use rocev2_user::{
    control::qp_telemetry,
    sys::netns::{in_netns, spawn_in_netns},
    testbed::ecmp_lab::{EcmpLab, DEST_V4},
    testbed::fault::PsnDropper,
    tools::rc::{self, ResponderQpReport},
    tools::sink::{Sink, SinkArgs},
};

const QPS: u32 = 8;
const FIRST_QP: u32 = 0x100;
const MESSAGES: u32 = 8;
const MESSAGE_PACKETS: u32 = 4;
const PSNS: u32 = MESSAGES * MESSAGE_PACKETS;
/// (DestQP, PSN) dropped once on the uplinks' far ends, after the switch.
const DROPS: [(u32, u32); 2] = [(FIRST_QP, 5), (FIRST_QP + 3, 20)];
/// (DestQP, PSN) dropped once on the sender's egress, before the switch.
const UPSTREAM_DROPS: [(u32, u32); 1] = [(FIRST_QP + 5, 12)];

/// Every drop, wherever it happens: what the endpoints see.
fn all_drops() -> impl Iterator<Item = (u32, u32)> {
    DROPS.into_iter().chain(UPSTREAM_DROPS)
}

#[test]
fn rc_resends_exactly_the_naked_ranges_and_telemetry_sees_them() {
    require_root();
    let lab = EcmpLab::create(2).expect("build the lab");
    let config = lab.write_config_text("rc", &lab.rc_config("qp")).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).expect("start rocev2 run");

    let drops: Vec<(u32, u32, u32)> = DROPS.iter().map(|&(qp, psn)| (qp, psn, 1)).collect();
    let mut droppers = Vec::new();
    let mut responders = Vec::new();
    let (ready_tx, ready_rx) = mpsc::channel();
    for ns in &lab.uplinks {
        let d = drops.clone();
        droppers.push(in_netns(ns.name(), move || PsnDropper::attach("up0", &d)).expect("fault injector"));
        let ready = ready_tx.clone();
        responders.push(
            spawn_in_netns(ns.name(), move || {
                let mut args = SinkArgs::new("up0");
                args.rc = true;
                args.ack_every = 8;
                args.idle_exit = 1.0;
                args.duration = Some(30.0);
                let sink = Sink::open(&args)?;
                ready.send(()).ok();
                sink.receive()
            })
            .unwrap(),
        );
    }
    for _ in &lab.uplinks {
        ready_rx.recv_timeout(Duration::from_secs(10)).expect("responder did not start");
    }
    let upstream: Vec<(u32, u32, u32)> = UPSTREAM_DROPS.iter().map(|&(qp, psn)| (qp, psn, 1)).collect();
    droppers.push(
        in_netns(lab.sender.name(), move || PsnDropper::attach_egress("snd0", &upstream))
            .expect("egress fault injector"),
    );

    // A trace of one QP's WRITE FIRST packets, started before the traffic.
    let mut trace = std::process::Command::new(rocev2_bin())
        .args(["trace", "--qp", "0x101", "--opcode", "0x06", "--count", "8", "--duration", "20", "--json", "--pin-dir"])
        .arg(lab.pin_dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut started = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(trace.stderr.take().unwrap()), &mut started).unwrap();
    assert!(started.starts_with("tracing"), "rocev2 trace: {started}");

    let mut args = lab.rc_requester_args(QPS, FIRST_QP);
    args.messages = MESSAGES;
    args.message_packets = MESSAGE_PACKETS;
    args.payload = 256;
    args.window = 16;
    args.ack_timeout_ms = 2000; // only NAKs may cause resends here
    let report = in_netns(lab.sender.name(), move || rc::request(&args)).expect("requester");
    eprintln!("{}", report.render());

    // The switch's view, read while it still runs.
    let qps = qp_telemetry::read_qps(&lab.pin_dir()).expect("read the QP table");
    let members = qp_telemetry::read_members(&lab.pin_dir(), 0, 2).expect("read member sums");
    let top = std::process::Command::new(rocev2_bin())
        .args(["top", "--once", "--json", "--pin-dir"])
        .arg(lab.pin_dir())
        .output()
        .unwrap();
    let stats = std::process::Command::new(rocev2_bin())
        .args(["stats", "--json", "--pin-dir"])
        .arg(lab.pin_dir())
        .output()
        .unwrap();
    let metrics = rocev2_user::control::metrics::scrape(&lab.pin_dir()).expect("scrape the metrics");
    for args in [&["top", "--once"][..], &["stats"][..]] {
        let out =
            std::process::Command::new(rocev2_bin()).args(args).arg("--pin-dir").arg(lab.pin_dir()).output().unwrap();
        eprintln!("$ rocev2 {}\n{}", args.join(" "), String::from_utf8_lossy(&out.stdout));
    }
    let traced = trace.wait_with_output().unwrap();
    let responded: Vec<ResponderQpReport> =
        responders.into_iter().flat_map(|r| r.join().unwrap().unwrap().responder).collect();
    drop(droppers);
    dataplane.stop().expect("rocev2 run stops cleanly");

    // The requester: complete, no timeouts, and for each dropped PSN one
    // NAK and one resend from exactly that PSN through the highest PSN sent.
    assert!(report.complete, "{}", report.render());
    assert_eq!(report.timeouts, 0);
    for q in &report.qps {
        let dropped: Vec<u32> = all_drops().filter(|d| d.0 == q.dest_qp).map(|d| d.1).collect();
        assert_eq!(q.sequence_naks, dropped.len() as u64, "QP {:#x}", q.dest_qp);
        assert_eq!(q.retransmissions.len(), dropped.len(), "QP {:#x}: {:?}", q.dest_qp, q.retransmissions);
        let mut resent = 0;
        for (r, psn) in q.retransmissions.iter().zip(&dropped) {
            assert_eq!((r.from_psn, r.cause), (*psn, "nak"), "QP {:#x}", q.dest_qp);
            assert!(r.to_psn >= r.from_psn && r.to_psn < PSNS);
            resent += u64::from(r.to_psn - r.from_psn + 1);
        }
        assert_eq!(q.retransmitted, resent, "QP {:#x} resent more than the NAKed range", q.dest_qp);
        assert_eq!(q.sent, u64::from(PSNS) + resent);
    }

    // The responders: every PSN of every QP delivered once, in order; the
    // packets that overtook a dropped one were refused, once each.
    assert_eq!(responded.len(), QPS as usize, "{responded:?}");
    for r in &responded {
        assert_eq!((r.delivered, r.next_psn, r.duplicates), (u64::from(PSNS), PSNS, 0), "{r:?}");
        let q = report.qp(r.dest_qp).unwrap();
        let overtaken: u64 = q.retransmissions.iter().map(|x| u64::from(x.to_psn - x.from_psn)).sum();
        assert_eq!(r.out_of_sequence, overtaken, "{r:?}");
        assert_eq!(r.sequence_naks_sent, q.sequence_naks);
    }

    // The switch saw both directions: each faulty QP with its NAK and one
    // backward PSN jump (the resend), the others clean, all data counted
    // but the packets lost before the switch, whose gap it saw.
    assert_eq!(qps.len(), QPS as usize, "{qps:?}");
    for e in &qps {
        let q = report.qp(e.dest_qp).unwrap();
        let s = &e.stats;
        let lost_upstream = UPSTREAM_DROPS.iter().filter(|d| d.0 == e.dest_qp).count() as u64;
        assert_eq!(e.dst.to_string(), DEST_V4);
        assert_eq!(s.packets, q.sent - lost_upstream, "QP {:#x}", e.dest_qp);
        assert_eq!(s.naks_sequence, q.sequence_naks, "QP {:#x}", e.dest_qp);
        assert_eq!(s.psn_backward_jumps, q.retransmissions.len() as u64, "QP {:#x}", e.dest_qp);
        assert_eq!((s.psn_forward_jumps, s.psns_skipped), (lost_upstream, lost_upstream), "QP {:#x}", e.dest_qp);
        assert!(s.acks > 0);
    }
    // Per member: the NAKs land on the members that carried the faulty QPs.
    for (position, m) in members.iter().enumerate() {
        let expected: u64 =
            qps.iter().filter(|e| e.stats.position == position as u32).map(|e| e.stats.naks_sequence).sum();
        assert_eq!(m.naks_sequence, expected, "member {position}: {members:?}");
    }
    assert_eq!(members.iter().map(|m| m.naks_sequence).sum::<u64>(), all_drops().count() as u64);

    // The same per-member numbers in `stats --json` and in the metrics,
    // which name members and never QPs.
    assert!(stats.status.success(), "rocev2 stats: {}", String::from_utf8_lossy(&stats.stderr));
    let stats: serde_json::Value = serde_json::from_slice(&stats.stdout).expect("stats JSON");
    assert_eq!(stats["telemetry_qps"], QPS);
    for (position, m) in members.iter().enumerate() {
        let member = &stats["groups"][0]["members"][position];
        assert_eq!(member["transport"]["naks_sequence"], m.naks_sequence, "{member}");
        assert_eq!(member["transport"]["retransmits"], m.psn_backward_jumps, "{member}");
        let dev = member["dev"].as_str().unwrap();
        let line = metrics
            .lines()
            .find(|l| {
                l.starts_with("rocev2_member_naks_total{")
                    && l.contains(&format!("member=\"{dev}\""))
                    && l.contains("sequence_error")
            })
            .unwrap_or_else(|| panic!("no NAK metric for {dev}:\n{metrics}"));
        assert!(line.ends_with(&format!(" {}", m.naks_sequence)), "{line}");
    }
    assert!(!metrics.contains("qp="), "per-QP labels in the metrics:\n{metrics}");

    // `rocev2 trace` printed exactly the filtered packets: QP 0x101's eight
    // WRITE FIRSTs (one per message, PSNs 0, 4, ..., 28), with their member.
    assert!(traced.status.success(), "rocev2 trace failed");
    eprintln!("$ rocev2 trace --qp 0x101 --opcode 0x06 --json\n{}", String::from_utf8_lossy(&traced.stdout));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&traced.stdout).lines().map(|l| serde_json::from_str(l).expect("trace JSON")).collect();
    let member_of_101 = qps.iter().find(|e| e.dest_qp == 0x101).unwrap().stats.position;
    assert_eq!(lines.len(), MESSAGES as usize, "{lines:?}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!((l["dest_qp"].as_u64(), l["opcode"].as_u64()), (Some(0x101), Some(6)), "{l}");
        assert_eq!(l["psn"], i as u64 * u64::from(MESSAGE_PACKETS), "{l}");
        assert_eq!(l["member"], format!("u{}", member_of_101 + 1), "{l}");
        assert_eq!(l["group"], "spines");
        assert!(l["bucket"].is_u64(), "{l}");
    }

    // `rocev2 top --json` shows the same table, unhealthiest first.
    assert!(top.status.success(), "rocev2 top: {}", String::from_utf8_lossy(&top.stderr));
    let top: serde_json::Value = serde_json::from_slice(&top.stdout).expect("top JSON");
    let rows = top["qps"].as_array().expect("qps in top JSON");
    assert_eq!(rows.len(), QPS as usize);
    for row in &rows[..all_drops().count()] {
        let qp = row["dest_qp"].as_u64().unwrap() as u32;
        assert!(all_drops().any(|d| d.0 == qp), "a faulty QP first: {top}");
        assert_eq!(row["naks_sequence"], 1, "{top}");
        assert_eq!(row["group"], "spines");
        let position = qps.iter().find(|e| e.dest_qp == qp).unwrap().stats.position;
        assert_eq!(row["member"], format!("u{}", position + 1), "{top}");
    }
}

/// Streams 4 QPs through the switch for a second and returns `rocev2 top
/// --once --json` (the collision detector's verdict included).
fn top_under_stream(lab: &EcmpLab, hash: &str, qps: &[u32]) -> serde_json::Value {
    use rocev2_common::bth::{opcode, Bth};
    use rocev2_user::testbed::ecmp_lab::{lab_frame_from_port, Family};
    let text = lab.rc_config(hash);
    let config = lab.write_config_text(hash, &text).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).expect("start rocev2 run");
    let frames: Vec<Vec<u8>> = (0..64u32)
        .flat_map(|psn| {
            qps.iter().map(move |&qp| {
                lab_frame_from_port(Family::V4, Bth::new(opcode::WRITE_MIDDLE, qp, psn), 2, 1024, 0xC000)
            })
        })
        .collect();
    let stream = lab.start_stream(frames, 4000).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    live_top_refreshes_with_interval_rates(lab, qps);
    let top = std::process::Command::new(rocev2_bin())
        .args(["top", "--once", "--json", "--pin-dir"])
        .arg(lab.pin_dir())
        .output()
        .unwrap();
    let text = std::process::Command::new(rocev2_bin())
        .args(["top", "--once", "--rows", "4", "--pin-dir"])
        .arg(lab.pin_dir())
        .output()
        .unwrap();
    eprintln!("$ rocev2 top --once --rows 4\n{}", String::from_utf8_lossy(&text.stdout));
    stream.stop().unwrap();
    dataplane.stop().expect("rocev2 run stops cleanly");
    assert!(top.status.success(), "rocev2 top: {}", String::from_utf8_lossy(&top.stderr));
    let top: serde_json::Value = serde_json::from_slice(&top.stdout).expect("top JSON");
    // First and last seen are CLOCK_MONOTONIC ns (the coarse clock, read
    // once a tick per CPU): a QP's lifetime rate, packets over last minus
    // first seen, is the stream's 1,000 a second, and the one still sending
    // was seen within the last moments by `top`'s own clock.
    for &qp in qps {
        let row = top["qps"].as_array().unwrap().iter().find(|r| r["dest_qp"] == qp).expect("the QP's row");
        let (pps, idle) = (row["pps"].as_f64().unwrap(), row["idle_secs"].as_f64().unwrap());
        assert!((500.0..2000.0).contains(&pps), "QP {qp:#x}: {pps} pps over its lifetime: {row:#}");
        assert!((0.0..0.5).contains(&idle), "QP {qp:#x} idle {idle} s while its stream runs: {row:#}");
    }
    top
}

/// `rocev2 top` without `--once` keeps refreshing: one JSON snapshot per
/// interval, each with the rates of that interval (the stream sends 4,000
/// frames a second over `qps`, so about 1,000 per QP), and the terminal view
/// redraws the screen each time.
fn live_top_refreshes_with_interval_rates(lab: &EcmpLab, qps: &[u32]) {
    let run_for = |extra: &[&str]| {
        let mut child = std::process::Command::new(rocev2_bin())
            .args(["top", "--interval", "0.3", "--pin-dir"])
            .arg(lab.pin_dir())
            .args(extra)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start rocev2 top");
        std::thread::sleep(Duration::from_millis(1500));
        child.kill().unwrap();
        child.wait_with_output().unwrap().stdout
    };
    let out = run_for(&["--json"]);
    let snapshots: Vec<serde_json::Value> =
        serde_json::Deserializer::from_slice(&out).into_iter().collect::<Result<_, _>>().expect("a stream of JSON");
    assert!(snapshots.len() >= 3, "one snapshot per 0.3 s refresh, got {}", snapshots.len());
    let last = snapshots.last().unwrap();
    for &qp in qps {
        let row =
            last["qps"].as_array().unwrap().iter().find(|r| r["dest_qp"] == qp).unwrap_or_else(|| panic!("{last:#}"));
        let pps = row["pps"].as_f64().unwrap();
        assert!((200.0..4000.0).contains(&pps), "QP {qp:#x} at {pps} pps over the last interval: {last:#}");
    }
    let screen = String::from_utf8_lossy(&run_for(&[])).into_owned();
    assert!(screen.matches("\x1b[2J").count() >= 3, "the view redraws each refresh: {screen}");
}

#[test]
fn collision_detector_fires_on_a_collision_and_stays_quiet_when_balanced() {
    require_root();
    let lab = EcmpLab::create(2).expect("build the lab");
    // One UDP source port and five-tuple hashing: every QP on one uplink,
    // the other idle.
    let qps = [0x100, 0x101, 0x102, 0x103];
    let top = top_under_stream(&lab, "five-tuple", &qps);
    let collisions = top["collisions"].as_array().expect("collisions");
    assert_eq!(collisions.len(), 1, "{top:#}");
    let c = &collisions[0];
    let named: Vec<&str> = c["qps"].as_array().unwrap().iter().map(|q| q.as_str().unwrap()).collect();
    assert_eq!(named.len(), 4, "{c:#}");
    for qp in qps {
        assert!(named.contains(&format!("{DEST_V4}/{qp:#x}").as_str()), "{c:#}");
    }
    let busy = c["member"].as_str().unwrap();
    let idle = c["idle_members"].as_array().unwrap();
    assert_eq!(idle.len(), 1);
    assert_ne!(idle[0].as_str().unwrap(), busy);
    let tips: Vec<&str> = c["suggestions"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    assert!(tips.iter().any(|t| t.contains("[[pin]]") && t.contains(idle[0].as_str().unwrap())), "{tips:?}");
    // A five-tuple group: the first advice is the qp hash, which tells QPs
    // of one five-tuple apart; more QPs on that five-tuple would not help.
    assert!(tips[0].starts_with("hash = \"qp\" in [[group]] spines: these QPs share one five-tuple"), "{tips:?}");
    assert!(!tips.iter().any(|t| t.contains("more QPs")), "{tips:?}");
    // One five-tuple: no seed can separate the QPs, and the detector says so.
    assert!(tips.iter().any(|t| t.contains("no hash_seed")), "{tips:?}");

    // The qp hash spreads the same QPs over both uplinks: nothing to report.
    let top = top_under_stream(&lab, "qp", &qps);
    let members: std::collections::BTreeSet<&str> =
        top["qps"].as_array().unwrap().iter().map(|r| r["member"].as_str().unwrap()).collect();
    assert_eq!(members.len(), 2, "both uplinks carry QPs: {top:#}");
    assert_eq!(top["collisions"].as_array().unwrap().len(), 0, "{top:#}");
}
