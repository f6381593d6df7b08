//! `rocev2 gen` and `rocev2 sink` across a veth between two namespaces:
//! the sink must count exactly what the generator sent, per QP, in PSN
//! order, with valid ICRCs and the requested ECN codepoint. Plus an
//! independent check of the generator's frames with scapy.

use std::{net::IpAddr, process::Command, sync::mpsc, time::Duration};

use rocev2_common::bth::opcode;
use rocev2_tests::require_root;
use rocev2_user::{
    sys::netns::{in_netns, spawn_in_netns, unique_name, veth_between, Netns},
    tools::gen::{self, EcnArg, GenArgs, GenMode, GenReport, SportModel, TrafficKind, PSN_MASK},
    tools::packet::parse_roce,
    tools::sink::{Sink, SinkArgs, SinkReport},
};

const MAC_GEN: [u8; 6] = [0x02, 0x6E, 0, 0, 0, 1];
const MAC_SINK: [u8; 6] = [0x02, 0x5C, 0, 0, 0, 2];
const MAC_SINK_STR: &str = "02:5c:00:00:00:02";

/// Generator namespace -- veth -- sink namespace. No IP addresses: the
/// frames only need to reach the sink's packet socket.
struct Pair {
    gen_ns: Netns,
    sink_ns: Netns,
    gen_if: String,
    sink_if: String,
}

fn pair() -> Pair {
    require_root();
    let gen_ns = Netns::create(&unique_name("gsg")).unwrap();
    let sink_ns = Netns::create(&unique_name("gss")).unwrap();
    let (gen_if, sink_if) = (unique_name("gg"), unique_name("gs"));
    veth_between(&gen_ns, &gen_if, MAC_GEN, &[], &sink_ns, &sink_if, MAC_SINK, &[]).unwrap();
    Pair { gen_ns, sink_ns, gen_if, sink_if }
}

impl Pair {
    fn args(&self, v6: bool) -> GenArgs {
        let (src, dst): (IpAddr, IpAddr) = if v6 {
            ("fd00:9::1".parse().unwrap(), "fd00:9::2".parse().unwrap())
        } else {
            ("10.9.0.1".parse().unwrap(), "10.9.0.2".parse().unwrap())
        };
        let mut a = GenArgs::new(&self.gen_if, MAC_SINK_STR, src, dst);
        // Well below what one sink thread can take on a small VM, so any
        // loss is a bug, not an overrun receive buffer.
        a.rate = Some(50_000);
        a
    }

    /// Starts a sink, runs the generator, waits for the sink to go idle.
    fn exchange(&self, args: &GenArgs) -> (GenReport, SinkReport) {
        let mut sink_args = SinkArgs::new(&self.sink_if);
        sink_args.idle_exit = 0.7;
        sink_args.duration = Some(30.0);
        let (ready_tx, ready_rx) = mpsc::channel();
        let sink = spawn_in_netns(self.sink_ns.name(), move || {
            let sink = Sink::open(&sink_args)?;
            ready_tx.send(()).ok();
            sink.receive()
        })
        .unwrap();
        ready_rx.recv_timeout(Duration::from_secs(10)).expect("sink did not start");
        let g = args.clone();
        let gen_report = in_netns(self.gen_ns.name(), move || gen::generate(&g)).unwrap();
        let sink_report = sink.join().expect("sink panicked").unwrap();
        eprintln!("{}\n{}", gen_report.render(), sink_report.render());
        (gen_report, sink_report)
    }
}

/// The sink saw exactly the frames gen built, per QP, in order, unharmed.
fn assert_exact(args: &GenArgs, g: &GenReport, s: &SinkReport) {
    let frames = gen::build_frames(args, MAC_GEN, g.packets).unwrap();
    assert_eq!(s.packets, g.packets, "sink count != gen count");
    assert_eq!(s.bytes, g.bytes);
    assert_eq!(s.bad_icrc, 0);
    assert_eq!(s.bad_ipv4_checksum, 0);
    assert!(s.in_order(), "reordered {} gaps {} missing {} dup {}", s.reordered, s.gaps, s.missing, s.duplicates);
    let ecn = &s.ecn;
    let per_codepoint = [ecn.not_ect, ecn.ect1, ecn.ect0, ecn.ce];
    assert_eq!(per_codepoint[args.ecn.codepoint() as usize], s.packets, "{ecn:?}");
    assert_eq!(s.ce_marked, if args.ecn == EcnArg::Ce { s.packets } else { 0 });

    assert_eq!(s.qps.len() as u32, args.qps.min(g.packets as u32));
    for q in 0..args.qps {
        let qp = args.first_qp + q;
        let mine: Vec<_> = frames.iter().filter(|f| parse_roce(f).unwrap().bth.dest_qp == qp).collect();
        let r = s.qp(qp).unwrap_or_else(|| panic!("QP {qp:#x} missing"));
        assert_eq!(r.packets, mine.len() as u64, "QP {qp:#x}");
        assert_eq!(r.bytes, mine.iter().map(|f| f.len() as u64).sum::<u64>(), "QP {qp:#x}");
        let class = |op: u8| mine.iter().filter(|f| parse_roce(f).unwrap().bth.opcode == op).count() as u64;
        assert_eq!(r.acks, class(opcode::ACK));
        assert_eq!(r.cnps, class(opcode::CNP));
        assert_eq!(r.data, r.packets - r.acks - r.cnps);
        assert_eq!(r.src, Some(args.src));
        assert_eq!(r.dst, Some(args.dst));
    }
}

#[test]
fn write_ipv4_psns_wrap_across_passes() {
    let p = pair();
    let mut a = p.args(false);
    a.qps = 8;
    a.message_packets = 4;
    a.first_psn = PSN_MASK - 9;
    a.sport = SportModel::Nic;
    a.count = Some(8 * 4 * 10);
    let (g, s) = p.exchange(&a);
    assert_eq!(g.packets, 320);
    assert_exact(&a, &g, &s);
    // Each QP's 40 PSNs ran through the wrap: 0xFFFFF6 ..= 0xFFFFFF, 0 ..= 29.
    let q = s.qp(0x100).unwrap();
    assert_eq!((q.first_psn, q.last_psn), (Some(PSN_MASK - 9), Some(29)));
}

#[test]
fn write_ipv6_vlan_one_pass_by_default() {
    let p = pair();
    let mut a = p.args(true);
    a.qps = 4;
    a.message_packets = 3;
    a.payload = 333;
    a.vlan = Some(10);
    a.ecn = EcnArg::Ect1;
    a.rate = None; // one pass is small: as fast as possible
    let (g, s) = p.exchange(&a);
    assert_eq!(g.packets, 12, "default count is one message per QP");
    assert_exact(&a, &g, &s);
}

#[test]
fn ack_traffic() {
    let p = pair();
    let mut a = p.args(false);
    a.traffic = TrafficKind::Ack;
    a.qps = 5;
    a.count = Some(50);
    a.ecn = EcnArg::NotEct;
    let (g, s) = p.exchange(&a);
    assert_exact(&a, &g, &s);
    assert_eq!(s.acks, 50);
}

#[test]
fn cnp_traffic_ce_marked() {
    let p = pair();
    let mut a = p.args(false);
    a.traffic = TrafficKind::Cnp;
    a.qps = 3;
    a.count = Some(30);
    a.dscp = 48;
    a.ecn = EcnArg::Ce;
    let (g, s) = p.exchange(&a);
    assert_exact(&a, &g, &s);
    assert_eq!((s.cnps, s.becn, s.ce_marked), (30, 30, 30));
}

#[test]
fn cts_traffic() {
    let p = pair();
    let mut a = p.args(true);
    a.traffic = TrafficKind::Cts;
    a.qps = 4;
    a.count = Some(40);
    let (g, s) = p.exchange(&a);
    assert_exact(&a, &g, &s);
    assert_eq!(s.data, 40);
}

#[test]
fn mix_traffic() {
    let p = pair();
    let mut a = p.args(false);
    a.traffic = TrafficKind::Mix;
    a.qps = 4;
    a.message_packets = 2;
    a.sport = SportModel::Random;
    a.count = Some(4 * 4 * 5);
    let (g, s) = p.exchange(&a);
    assert_exact(&a, &g, &s);
    assert_eq!((s.data, s.acks), (60, 20));
}

#[test]
fn rate_and_duration() {
    let p = pair();
    let mut a = p.args(false);
    a.qps = 2;
    a.rate = Some(2_000);
    a.duration = Some(0.5);
    let (g, s) = p.exchange(&a);
    assert!((800..=1100).contains(&g.packets), "{} packets in 0.5 s at 2000 pps", g.packets);
    assert!((0.45..0.8).contains(&g.elapsed_secs), "{}", g.elapsed_secs);
    assert_exact(&a, &g, &s);
}

/// Live frames: BPF_PROG_RUN transmits through XDP_TX out of the generator's
/// veth; the sink's end needs NAPI (GRO on) to take XDP frames.
#[test]
fn live_frames_reach_the_sink() {
    let p = pair();
    p.sink_ns.exec(&["ethtool", "-K", &p.sink_if, "gro", "on"]).unwrap();

    // One copy per call: the sink can check order and count exactly.
    let mut a = p.args(false);
    a.mode = GenMode::LiveFrames;
    a.live_repeat = 1;
    a.qps = 4;
    a.count = Some(4 * 4 * 8);
    let (g, s) = p.exchange(&a);
    assert_eq!(g.prog_runs, 128);
    assert_exact(&a, &g, &s);

    // Full speed, 64 copies per call (duplicate PSNs by design): how many
    // of them arrive depends on the sink thread, so only check that they
    // flow and are intact.
    let mut a = p.args(false);
    a.mode = GenMode::LiveFrames;
    a.rate = None;
    a.live_repeat = 64;
    a.payload = 64;
    a.duration = Some(1.0);
    let (g, s) = p.exchange(&a);
    eprintln!("live frames: submitted {:.0} pps, sink received {} of {} packets", g.pps, s.packets, g.packets);
    // Rates on a shared 2-CPU VM vary a lot; this only proves frames flow.
    assert!(g.packets >= 640, "{}", g.packets);
    assert!(s.packets >= 64, "sink got {}", s.packets);
    assert_eq!(s.bad_icrc, 0);
    assert_eq!(s.reordered, 0);
}

/// A `gen` killed in live-frames mode leaves its private dispatcher veth
/// behind; the next live-frames `gen` in that namespace deletes it, and
/// leaves alone the one of a `gen` still running.
#[test]
fn live_frames_remove_the_holds_of_killed_gens() {
    let p = pair();
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let mut alive = Command::new("sleep").arg("60").spawn().unwrap();
    let (orphan, kept) = (format!("r2h{dead_pid:x}.0"), format!("r2h{:x}.0", alive.id()));
    for name in [&orphan, &kept] {
        p.gen_ns.exec(&["ip", "link", "add", name, "type", "veth", "peer", "name", &format!("{name}p")]).unwrap();
    }

    let mut a = p.args(false);
    a.mode = GenMode::LiveFrames;
    a.live_repeat = 1;
    a.count = Some(8);
    let g = a.clone();
    let report = in_netns(p.gen_ns.name(), move || gen::generate(&g)).unwrap();
    alive.kill().unwrap();
    alive.wait().unwrap();
    assert_eq!(report.packets, 8);

    let links = p.gen_ns.exec(&["ip", "-o", "link", "show"]).unwrap();
    let has = |name: &str| {
        links.lines().any(|l| {
            l.split_whitespace().nth(1).is_some_and(|n| n.trim_end_matches(':').split('@').next() == Some(name))
        })
    };
    assert!(!has(&orphan) && !has(&format!("{orphan}p")), "the killed gen's hold is still there:\n{links}");
    assert!(has(&kept), "the running process's hold was deleted:\n{links}");
    // This gen's own hold went with it.
    assert_eq!(links.lines().filter(|l| l.contains(": r2h")).count(), 2, "{links}");
}

/// scapy decodes the generator's frames on its own: opcode, DestQP, PSN,
/// AckReq, BECN, the AETH's MSN, and recomputes lengths, IP checksum and
/// ICRC, which must give back the very same bytes.
#[test]
fn scapy_decodes_generated_frames() {
    const SCRIPT: &str = r#"
import sys
from scapy.layers.l2 import Ether
from scapy.layers.inet import IP, UDP
from scapy.contrib.roce import BTH, AETH
for line in open(sys.argv[1]):
    want = bytes.fromhex(line.strip())
    p = Ether(want)
    b = p[BTH]
    msn = p[AETH].msn if AETH in p else -1
    fields = f"{b.opcode} {b.dqpn} {b.psn} {b.ackreq} {b.becn} {msn}"
    del p[IP].len, p[IP].chksum, p[UDP].len, p[BTH].icrc
    print(fields, "same" if bytes(p) == want else "DIFFERENT")
"#;
    let src: IpAddr = "192.0.2.1".parse().unwrap();
    let dst: IpAddr = "192.0.2.2".parse().unwrap();
    let mut expected: Vec<String> = Vec::new();
    let mut frames = Vec::new();
    for kind in [TrafficKind::Write, TrafficKind::Ack, TrafficKind::Cnp, TrafficKind::Cts] {
        let mut a = GenArgs::new("unused", MAC_SINK_STR, src, dst);
        a.traffic = kind;
        a.qps = 3;
        a.payload = 77;
        a.first_psn = PSN_MASK - 2; // the write frames wrap
        a.message_packets = 3;
        let count = 3 * 3 * 2;
        frames.extend(gen::build_frames(&a, MAC_GEN, count).unwrap());
        for i in 0..count as u32 {
            let (qp, n) = (0x100 + i % 3, i / 3);
            let psn_from = |first: u32| (first + n) & PSN_MASK;
            let line = match kind {
                TrafficKind::Write => {
                    let op = [opcode::WRITE_FIRST, opcode::WRITE_MIDDLE, opcode::WRITE_LAST][(n % 3) as usize];
                    format!("{op} {qp} {} {} 0 -1", psn_from(PSN_MASK - 2), u8::from(n % 3 == 2))
                }
                TrafficKind::Ack => format!("{} {qp} {} 0 0 {}", opcode::ACK, psn_from(PSN_MASK - 2), n + 1),
                TrafficKind::Cnp => format!("{} {qp} 0 0 1 -1", opcode::CNP),
                TrafficKind::Cts => format!("{} {qp} {} 1 0 -1", opcode::WRITE_ONLY_IMM, psn_from(PSN_MASK - 2)),
                TrafficKind::Mix => unreachable!(),
            };
            expected.push(line + " same");
        }
    }
    let path = std::env::temp_dir().join(format!("rocev2-gen-scapy-{}.hex", std::process::id()));
    let hex: String = frames.iter().map(|f| f.iter().map(|b| format!("{b:02x}")).collect::<String>() + "\n").collect();
    std::fs::write(&path, hex).unwrap();
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(&path)
        .output()
        .expect("run /usr/bin/python3 (apt-get install python3-scapy)");
    let _ = std::fs::remove_file(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "scapy failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let got: Vec<&str> = stdout.lines().collect();
    assert_eq!(got.len(), expected.len(), "{stdout}");
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "frame {i} (scapy line vs expected)");
    }
}

/// Ctrl-C stops a running `rocev2 sink` early, and it still prints its
/// report and exits successfully (SIGINT is a flag while it runs).
#[test]
fn sigint_stops_the_sink_with_its_report() {
    let p = pair();
    let mut sink = Command::new(rocev2_tests::rocev2_bin())
        .args(["--netns", p.sink_ns.name(), "sink", "--dev", &p.sink_if, "--duration", "60"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start rocev2 sink");
    std::thread::sleep(Duration::from_millis(1500));
    let started = std::time::Instant::now();
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(sink.id() as i32, libc::SIGINT) }, 0);
    while sink.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if sink.try_wait().unwrap().is_none() {
        let _ = sink.kill();
        panic!("rocev2 sink did not stop within 10 s of SIGINT");
    }
    let out = sink.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "status {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    assert!(stdout.contains("0 RoCEv2 packets"), "no report after SIGINT:\nstdout:\n{stdout}\nstderr:\n{stderr}");
}

/// `rocev2 fault` on the sink's interface loses exactly the chosen (QP,
/// PSN) packets: the sink sees those gaps and nothing else, and the tool
/// exits on its own once every drop happened, saying what it lost.
#[test]
fn fault_loses_exactly_the_chosen_packets() {
    let p = pair();
    let mut fault = Command::new(rocev2_tests::rocev2_bin())
        .args(["--netns", p.sink_ns.name(), "fault", "--dev", &p.sink_if])
        .args(["--drop", "0x100:3", "--drop", "0x101:0x7:1", "--duration", "30"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut started = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(fault.stderr.take().unwrap()), &mut started).unwrap();
    assert!(started.starts_with("rocev2 fault: on ") && started.contains("2 to lose"), "{started}");
    let mut a = p.args(false);
    a.qps = 3;
    a.message_packets = 10;
    a.count = Some(30);
    let (g, s) = p.exchange(&a);
    assert_eq!((g.packets, s.packets), (30, 28));
    for (qp, lost) in [(0x100, 1), (0x101, 1), (0x102, 0)] {
        let q = s.qp(qp).unwrap();
        assert_eq!((q.packets, q.gaps, q.missing, q.reordered), (10 - lost, lost, lost, 0), "QP {qp:#x}: {q:?}");
    }
    let out = fault.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("lost 2 of 2\n"), "{text}");
    assert!(text.contains("QP 0x101 PSN 7: lost 1 of 1"), "{text}");
}
