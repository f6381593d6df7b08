//! End-to-end tests of flowlets, ECN marking and priority classes through
//! the real `rocev2 run` in a namespace lab (see rocev2_user::testbed::ecmp_lab).

use std::time::Duration;

use rocev2_common::{
    bth::{opcode, Bth},
    ecn::{CE, ECT0, NOT_ECT},
};
use rocev2_tests::{require_root, rocev2_bin};
use rocev2_user::testbed::ecmp_lab::{lab_frame, EcmpLab, Family, LabReport};

const UPLINKS: usize = 4;

fn bth(op: u8, qp: u32, psn: u32) -> Bth {
    Bth::new(op, qp, psn)
}

/// Runs `rocev2 run` with the lab's qp config plus `extra` TOML (appended;
/// `group_keys` go into the [[group]] table) and sends `bursts`.
fn run(
    lab: &EcmpLab,
    group_keys: &str,
    extra: &str,
    bursts: Vec<Vec<Vec<u8>>>,
    pause: Duration,
) -> (LabReport, String) {
    let base = lab.config("qp");
    let text = base.replacen("name = \"spines\"\n", &format!("name = \"spines\"\n{group_keys}\n"), 1) + extra;
    let config = lab.write_config_text("test", &text).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).expect("rocev2 run starts");
    let report = lab.send_bursts_and_capture(bursts, pause).expect("send and capture");
    let output = dataplane.stop().expect("rocev2 run stops cleanly");
    (report, output)
}

/// Which uplink each (QP, PSN) arrived on, in PSN order per uplink.
fn uplink_of(report: &LabReport, qp: u32, psn: u32) -> Option<usize> {
    report.uplinks.iter().find(|u| u.seen.iter().any(|s| s.dest_qp == qp && s.psn == psn)).map(|u| u.uplink)
}

#[test]
fn flowlets_move_between_bursts_and_never_inside_one() {
    require_root();
    let lab = EcmpLab::create(UPLINKS).unwrap();
    // 12 bursts of one 16-packet WRITE message on ONE QP, 40 ms apart; the
    // gap is 5 ms, so every burst is a new flowlet that may take a new path.
    let qp = 0x321;
    let bursts: Vec<Vec<Vec<u8>>> = (0..12u32)
        .map(|b| {
            (0..16u32)
                .map(|i| {
                    let op = match i {
                        0 => opcode::WRITE_FIRST,
                        15 => opcode::WRITE_LAST,
                        _ => opcode::WRITE_MIDDLE,
                    };
                    lab_frame(Family::V4, bth(op, qp, b * 16 + i), ECT0, 512)
                })
                .collect()
        })
        .collect();
    let (report, output) = run(
        &lab,
        "policy = \"flowlet\"\nflowlet_gap_us = 5000\nflowlet_boundary = true",
        "",
        bursts,
        Duration::from_millis(40),
    );
    rocev2_tests::assert_no_switch_loss(&report, "the stream arrives");
    let mut paths = std::collections::BTreeSet::new();
    for b in 0..12u32 {
        let first = uplink_of(&report, qp, b * 16).expect("burst arrived");
        for i in 1..16 {
            assert_eq!(uplink_of(&report, qp, b * 16 + i), Some(first), "burst {b} stayed on one path");
        }
        paths.insert(first);
    }
    assert!(paths.len() >= 2, "bursts moved between members: {paths:?}");
    for u in &report.uplinks {
        assert_eq!(u.reordered, 0, "PSN order kept on up{}", u.uplink);
    }
    assert!(output.contains("flowlet_new"), "final counters show flowlets:\n{output}");
}

/// A slow port (8 Mbit/s = 1 MB/s) with a 10 kB / 40 kB / 100 % profile.
const ECN_CONFIG: &str = "\n[[ecn_profile]]\nname = \"test\"\nkmin = \"10KB\"\nkmax = \"40KB\"\npmax = 1.0\n";

fn egress_sections(lab: &EcmpLab) -> String {
    (1..=lab.uplinks.len())
        .map(|i| format!("\n[[egress]]\ndev = \"u{i}\"\nrate = \"8Mbit\"\necn_profile = \"test\"\n"))
        .collect()
}

#[test]
fn ecn_marks_ect_above_the_port_rate_and_nothing_below() {
    require_root();
    let lab = EcmpLab::create(UPLINKS).unwrap();
    let extra = format!("{ECN_CONFIG}{}", egress_sections(&lab));
    // Over the rate: 300 x 1 kB back to back on one QP (one uplink), ECT(0)
    // and Not-ECT interleaved.
    let burst: Vec<Vec<u8>> = (0..300u32)
        .map(|i| {
            lab_frame(Family::V4, bth(opcode::WRITE_MIDDLE, 0x55, i), if i % 2 == 0 { ECT0 } else { NOT_ECT }, 1024)
        })
        .collect();
    let (report, output) = run(&lab, "", &extra, vec![burst], Duration::ZERO);
    rocev2_tests::assert_no_switch_loss(&report, "the stream arrives");
    let seen: Vec<_> = report.uplinks.iter().flat_map(|u| u.seen.iter()).collect();
    let ect_marked = seen.iter().filter(|s| s.psn % 2 == 0 && s.ecn == CE).count();
    let not_ect_marked = seen.iter().filter(|s| s.psn % 2 == 1 && s.ecn != NOT_ECT).count();
    assert!(ect_marked >= 50, "ECT packets above kmax are marked: {ect_marked} of 150");
    assert_eq!(not_ect_marked, 0, "Not-ECT packets are never marked");
    assert!(output.contains("ecn_marked"), "run's final counters show marking:\n{output}");

    // Under the rate: 40 x 1 kB at 50 packets/s (50 kB/s): nothing marked.
    let slow: Vec<Vec<Vec<u8>>> =
        (0..40u32).map(|i| vec![lab_frame(Family::V4, bth(opcode::WRITE_MIDDLE, 0x56, i), ECT0, 1024)]).collect();
    let (report, _) = run(&lab, "", &extra, slow, Duration::from_millis(20));
    rocev2_tests::assert_no_switch_loss(&report, "the stream arrives");
    let marked: usize = report.uplinks.iter().flat_map(|u| u.seen.iter()).filter(|s| s.ecn == CE).count();
    assert_eq!(marked, 0, "below the port rate nothing is marked");
}

#[test]
fn control_classes_get_their_dscp_and_the_high_priority_htb_class() {
    require_root();
    let lab = EcmpLab::create(UPLINKS).unwrap();
    // tc forwarding sets skb->priority, which HTB uses to pick 1:10.
    for i in 1..=UPLINKS {
        let dev = format!("u{i}");
        lab.in_switch(&["tc", "qdisc", "add", "dev", &dev, "root", "handle", "1:", "htb", "default", "20"]).unwrap();
        lab.in_switch(&[
            "tc", "class", "add", "dev", &dev, "parent", "1:", "classid", "1:10", "htb", "rate", "1gbit", "prio", "0",
        ])
        .unwrap();
        lab.in_switch(&[
            "tc", "class", "add", "dev", &dev, "parent", "1:", "classid", "1:20", "htb", "rate", "1gbit", "prio", "1",
        ])
        .unwrap();
    }
    let classes = "\n[[class]]\nname = \"control\"\nopcodes = [0x11, 0x81]\nset_dscp = 48\npriority = \"1:10\"\necn_exempt = true\n\n[[class]]\nname = \"cts\"\nopcodes = [0x0B]\nmax_payload = 64\nset_dscp = 46\npriority = \"1:10\"\n";
    let base = lab.config("qp").replace("xdp_mode = \"native\"\n", "xdp_mode = \"native\"\nattach = \"tc\"\n");
    let config = lab.write_config_text("htb", &(base + classes)).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).expect("rocev2 run starts");
    let mut frames = Vec::new();
    for qp in 0..16u32 {
        frames.push(lab_frame(Family::V4, bth(opcode::ACK, 0x200 + qp, 1), ECT0, 4)); // ACK + AETH
        frames.push(lab_frame(Family::V4, bth(opcode::CNP, 0x200 + qp, 0), ECT0, 16));
        frames.push(lab_frame(Family::V4, bth(opcode::WRITE_ONLY_IMM, 0x200 + qp, 2), ECT0, 20)); // CTS-like
        frames.push(lab_frame(Family::V4, bth(opcode::WRITE_ONLY, 0x200 + qp, 3), ECT0, 1024));
        // data
    }
    let report = lab.send_bursts_and_capture(vec![frames], Duration::ZERO).unwrap();
    dataplane.stop().unwrap();
    rocev2_tests::assert_no_switch_loss(&report, "the stream arrives");
    for s in report.uplinks.iter().flat_map(|u| u.seen.iter()) {
        let want = match s.opcode {
            opcode::ACK | opcode::CNP => 48,
            opcode::WRITE_ONLY_IMM => 46,
            _ => 26,
        };
        assert_eq!(s.dscp, want, "opcode {:#x} leaves with DSCP {want}", s.opcode);
    }
    // HTB served 48 control packets from 1:10 and 16 data packets from 1:20.
    let (mut high, mut low) = (0u64, 0u64);
    for i in 1..=UPLINKS {
        let out = lab.in_switch(&["tc", "-s", "class", "show", "dev", &format!("u{i}")]).unwrap();
        high += htb_packets(&out, "1:10");
        low += htb_packets(&out, "1:20");
    }
    // Only the classed packets carry priority 1:10; the switch's own ARP/NDP
    // joins the data in the default class.
    assert!(high == 48 && low >= 16, "HTB 1:10 sent {high}, 1:20 sent {low}");
}

/// Packets sent by HTB class `id` in `tc -s class show` output.
fn htb_packets(out: &str, id: &str) -> u64 {
    let mut lines = out.lines();
    while let Some(line) = lines.next() {
        if line.contains(&format!("class htb {id} ")) {
            for l in lines.by_ref() {
                if let Some(rest) = l.trim().strip_prefix("Sent ") {
                    let mut words = rest.split_whitespace();
                    let _bytes = words.next();
                    let _ = words.next();
                    return words.next().and_then(|p| p.parse().ok()).unwrap_or(0);
                }
            }
        }
    }
    0
}

#[test]
fn local_traffic_is_classified_and_marked_in_tc_egress() {
    require_root();
    let lab = EcmpLab::create(1).unwrap();
    let classes = "\n[[class]]\nname = \"control\"\nopcodes = [0x11]\nset_dscp = 48\necn_exempt = true\n";
    let egress = "\n[[egress]]\ndev = \"u1\"\nrate = \"8Mbit\"\necn_profile = \"test\"\nlocal = true\n";
    let config = lab.write_config_text("local", &(lab.config("qp") + ECN_CONFIG + egress + classes)).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).expect("rocev2 run starts");
    // The switch itself sends RoCEv2 over UDP to uplink 1: 200 x 1 kB data
    // with ECT(0) (above the 1 MB/s port rate) and 10 ACKs.
    let capture = std::thread::spawn({
        let up = lab.uplinks[0].name().to_string();
        move || rocev2_user::sys::netns::in_netns(&up, || capture_udp_roce(Duration::from_secs(3)))
    });
    std::thread::sleep(Duration::from_millis(300));
    rocev2_user::sys::netns::in_netns(lab.switch.name(), || {
        let socket = std::net::UdpSocket::bind("10.0.1.1:0")?;
        set_tos(&socket, 26 << 2 | u32::from(ECT0));
        for i in 0..200u32 {
            socket.send_to(&roce_payload(opcode::WRITE_MIDDLE, i, 1024), "10.0.1.2:4791")?;
        }
        for i in 0..10u32 {
            socket.send_to(&roce_payload(opcode::ACK, 1000 + i, 4), "10.0.1.2:4791")?;
        }
        Ok(())
    })
    .unwrap();
    let seen = capture.join().unwrap().unwrap();
    dataplane.stop().unwrap();
    let data: Vec<_> = seen.iter().filter(|(op, ..)| *op == opcode::WRITE_MIDDLE).collect();
    let acks: Vec<_> = seen.iter().filter(|(op, ..)| *op == opcode::ACK).collect();
    assert_eq!((data.len(), acks.len()), (200, 10), "all local packets captured");
    assert!(data.iter().filter(|(_, _, ecn)| *ecn == CE).count() >= 50, "local data above the rate is marked");
    assert!(acks.iter().all(|(_, dscp, ecn)| *dscp == 48 && *ecn == ECT0), "ACKs get DSCP 48 and are exempt");
}

/// BTH + payload as the UDP payload of a locally sent RoCEv2 packet (no
/// ICRC needed: only classification and marking are checked).
fn roce_payload(op: u8, psn: u32, len: usize) -> Vec<u8> {
    let mut p = bth(op, 0x77, psn).to_bytes().to_vec();
    p.resize(12 + len, 0xAB);
    p
}

fn set_tos(socket: &std::net::UdpSocket, tos: u32) {
    use std::os::fd::AsRawFd;
    let tos = tos as libc::c_int;
    // SAFETY: valid socket and option value.
    unsafe {
        libc::setsockopt(socket.as_raw_fd(), libc::IPPROTO_IP, libc::IP_TOS, (&tos as *const libc::c_int).cast(), 4)
    };
}

/// (opcode, DSCP, ECN) of RoCEv2 UDP datagrams captured on up0.
fn capture_udp_roce(duration: Duration) -> anyhow::Result<Vec<(u8, u8, u8)>> {
    let socket = rocev2_user::sys::rawsock::PacketSocket::open("up0")?;
    let mut buf = vec![0u8; 65536];
    let mut seen = Vec::new();
    let end = std::time::Instant::now() + duration;
    while std::time::Instant::now() < end {
        let Some(len) = socket.recv(&mut buf, Duration::from_millis(100))? else { continue };
        let f = &buf[..len];
        // Ethernet + IPv4 (no options from the local stack) + UDP 4791.
        if len < 14 + 20 + 8 + 12 || f[12..14] != [0x08, 0x00] || f[23] != 17 || f[36..38] != [0x12, 0xB7] {
            continue;
        }
        seen.push((f[42], f[15] >> 2, f[15] & 3));
    }
    Ok(seen)
}
