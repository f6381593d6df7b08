//! Hitless changes at a high packet rate. In the `exclusive` test binary:
//! cargo runs test binaries one after another, so nothing else in the
//! suite competes for the CPUs while it measures.
//!
//! The stream: XDP live frames from `rocev2 gen`, paced at [`OFFERED_PPS`]
//! in calls of 1,024 frames (catching up on up to 100 ms of backlog), from a sender thread pinned to one CPU, into
//! the real `rocev2 run` on the switch, which forwards it to four uplinks
//! that drop everything in XDP and are counted from their rx counters.
//! Every window must carry at least 1 Mpps (measured, asserted) and lose
//! nothing. The control plane runs on the other CPUs, as an operator
//! would keep it off a forwarding CPU. A window that lost nothing but ran
//! below 1 Mpps is measured again (up to three times); a loss fails at once.
//!
//! Why paced, pinned and with a quiet sender: on a veth the receiving
//! side's NAPI runs on the CPU that transmitted, so the switch forwards
//! each batch inline, on the sender's CPU. When the sender migrated to the
//! other CPU, or when the sender namespace's own kernel (an IPv6 router
//! solicitation) scheduled the switch port's NAPI on the other CPU, the
//! switch port kept polling there while the sender, now doing no
//! forwarding, outran it: the port's 256-frame ring overflowed (seen with
//! nothing changing: up to 26,373 frames in 18 ms, counted as the sender's
//! `tx_queue_0_xdp_xmit_errors` and the port's rx `dropped`). A flat-out
//! sender never let the ring drain, so the split lasted. That is the test
//! harness overloading the box, not the switch losing packets, so the
//! sender is pinned, paced below what one CPU forwards (the ring drains
//! between calls), and its namespace sends nothing of its own (IPv6 off
//! on `snd0`; the stream is IPv4).

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use rocev2_tests::{require_root, rocev2_bin};
use rocev2_user::{
    control::dataplane::Maps,
    control::state::RunState,
    sys::format_mac,
    sys::netns::{device_counts, in_netns, in_netns_scoped, Netns},
    testbed::ecmp_lab::{uplink_mac, EcmpLab, DEST_V4},
    tools::gen::{allowed_cpus, generate, CpuPin, GenArgs, GenMode, GenReport},
    tools::programs::{ToolPrograms, XDP_DROP_PROGRAM},
};

const UPLINKS: usize = 4;
/// The rate the sender offers; each window must measure at least [`MIN_PPS`].
const OFFERED_PPS: u64 = 1_200_000;
const MIN_PPS: f64 = 1.0e6;
/// Frames per BPF_PROG_RUN call: about 1 ms of the stream.
const CALL_FRAMES: u32 = 1024;
/// Measurements of a window that ran below [`MIN_PPS`] without loss.
const MAX_ATTEMPTS: u32 = 3;

fn rocev2(args: &[&str]) -> std::process::Output {
    std::process::Command::new(rocev2_bin()).args(args).output().expect("run rocev2")
}

fn reload(config: &std::path::Path) {
    let out = rocev2(&["reload", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "reload: {}", String::from_utf8_lossy(&out.stderr));
}

/// The counters a window compares: veth counters of every link on the
/// path, and the dataplane's own counters of the switch port (from the
/// maps of every instance that ran during the window).
type Counters = BTreeMap<String, i64>;

fn link_counters(ns: &Netns, dev: &str, tag: &str, out: &mut Counters) {
    let text = ns.exec(&["ethtool", "-S", dev]).unwrap();
    for line in text.lines().skip(1) {
        let Some((k, v)) = line.trim().split_once(':') else { continue };
        if k != "peer_ifindex" {
            out.insert(format!("{tag}.{k}"), v.trim().parse().unwrap());
        }
    }
    let counts = device_counts(ns.name(), dev).unwrap();
    for (dir, c) in [("rx", counts.rx), ("tx", counts.tx)] {
        for (key, value) in [("packets", c.packets), ("dropped", c.dropped), ("errors", c.errors)] {
            out.insert(format!("{tag}.{dir}_{key}"), value as i64);
        }
    }
}

fn counters(lab: &EcmpLab, maps: &[(&str, &Maps)]) -> Counters {
    let mut c = Counters::new();
    link_counters(&lab.sender, "snd0", "snd0", &mut c);
    link_counters(&lab.switch, "p0", "p0", &mut c);
    for (i, up) in lab.uplinks.iter().enumerate() {
        link_counters(&lab.switch, &format!("u{}", i + 1), &format!("u{}", i + 1), &mut c);
        link_counters(up, "up0", &format!("up{}", i + 1), &mut c);
    }
    for (tag, m) in maps {
        for (k, v) in m.port_counters(1).unwrap() {
            c.insert(format!("rocev2{tag}.p0.{k}"), v as i64);
        }
    }
    c
}

/// Stream frames that reached the uplinks: what the receivers' XDP
/// program saw, less what the switch's own kernel sent on the uplinks
/// (router solicitations and the like; the switch's tx counts them
/// besides the frames its XDP program redirected there). Not the uplinks'
/// `ip -s` rx count: a kernel-sent frame once showed in the receiver's
/// `rx_queue_0_xdp_packets` but not in its rx packets, which read as a
/// lost frame.
fn received(before: &Counters, after: &Counters) -> i64 {
    let d = |k: String| after[&k] - before[&k];
    (1..=UPLINKS)
        .map(|i| {
            d(format!("up{i}.rx_queue_0_xdp_packets"))
                - (d(format!("u{i}.tx_packets")) - d(format!("u{i}.tx_queue_0_xdp_xmit")))
        })
        .sum()
}

fn changed(before: &Counters, after: &Counters) -> String {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d != 0 && !k.contains("bytes")).then(|| format!("  {k} +{d}\n"))
        })
        .collect()
}

struct Window {
    what: &'static str,
    sent: u64,
    received: i64,
    pps: f64,
}

/// The hitless guarantees at more than 1 Mpps: a window with no change
/// (the harness's own loss, which must be none), reloads that remove and
/// restore a member, reloads that add, retarget and remove routes (and a
/// group), and a handover to a new `rocev2 run`. Each counts sent against
/// received and must lose nothing.
#[test]
fn hitless_at_a_high_packet_rate() {
    require_root();
    let lab = EcmpLab::create(UPLINKS).unwrap();
    // Members by static MAC: the receivers answer no ARP.
    let mut text = lab.config("qp");
    for i in 1..=UPLINKS {
        for via in [format!("via = \"10.0.{i}.2\""), format!("via = \"fd00:{i}::2\"")] {
            text = text.replace(&via, &format!("mac = \"{}\"", format_mac(&uplink_mac(i))));
        }
    }
    let config = lab.write_config_text("fast", &text).unwrap();
    let mut receivers = ToolPrograms::load().unwrap();
    for up in &lab.uplinks {
        in_netns_scoped(up.name(), || {
            let ifindex = rocev2_user::sys::rawsock::PacketSocket::open("up0")?.ifindex();
            receivers.xdp(XDP_DROP_PROGRAM)?.attach_to_if_index(ifindex, aya::programs::XdpMode::Driver)?;
            Ok(())
        })
        .unwrap();
    }
    // A quiet sender: nothing but the stream enters the switch port.
    lab.sender.exec(&["sysctl", "-q", "-w", "net.ipv6.conf.snd0.disable_ipv6=1"]).unwrap();
    // A quiet switch kernel: an IPv6 router solicitation (sent from a timer,
    // on either CPU) out of an uplink scheduled the receiver's NAPI on the
    // control plane's CPU, where it kept polling while the stream filled
    // its 256-frame ring from the other CPU: 1,316 frames lost in one CI
    // window (the uplink's xdp_xmit_errors), with nothing wrong in the
    // switch. A router sends no solicitations anyway.
    for dev in std::iter::once("p0".to_string()).chain((1..=UPLINKS).map(|i| format!("u{i}"))) {
        lab.switch.exec(&["sysctl", "-q", "-w", &format!("net.ipv6.conf.{dev}.router_solicitations=0")]).unwrap();
    }
    let cpu = *allowed_cpus().unwrap().last().unwrap();
    // The control plane (both `rocev2 run`s, reload, stats, ethtool) runs
    // on the other CPUs: children inherit this thread's CPU set. Without
    // it a handover's start-up (ELF parsing, program verification) shared
    // the forwarding CPU and the stream fell to 0.85 Mpps on a CI machine.
    let _control_plane = CpuPin::except(cpu).unwrap();

    // Runs `change` while the stream flows (1 s before and after it);
    // returns the window's numbers and prints a breakdown if it lost any.
    let measure = |what: &'static str, change: &mut dyn FnMut()| -> Window {
        let pin_dir = lab.pin_dir();
        let old_maps = Maps::open_pinned(&pin_dir).unwrap();
        let before = counters(&lab, &[("", &old_maps)]);
        let stop = Arc::new(AtomicBool::new(false));
        let sender = lab.sender.name().to_string();
        let flag = stop.clone();
        let stream = thread::spawn(move || -> anyhow::Result<GenReport> {
            let mut args = GenArgs::new(
                "snd0",
                &format_mac(&rocev2_user::testbed::ecmp_lab::SWITCH_PORT_MAC),
                "10.0.0.1".parse().unwrap(),
                DEST_V4.parse().unwrap(),
            );
            args.mode = GenMode::LiveFrames;
            args.qps = 64;
            args.payload = 64;
            args.rate = Some(OFFERED_PPS);
            args.live_repeat = CALL_FRAMES;
            args.cpu = Some(cpu);
            args.stop = Some(flag);
            in_netns(&sender, move || generate(&args))
        });
        // The sender first loads its program: wait until the stream
        // flows through the switch, then a second more.
        let rx = |m: &Maps| m.port_counter(1, rocev2_common::counters::PortCounter::RxPackets).unwrap();
        let (start_rx, deadline) = (rx(&old_maps), Instant::now() + Duration::from_secs(20));
        while rx(&old_maps) < start_rx + 100_000 {
            assert!(Instant::now() < deadline && !stream.is_finished(), "{what}: the stream did not start");
            thread::sleep(Duration::from_millis(10));
        }
        thread::sleep(Duration::from_secs(1));
        change();
        thread::sleep(Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        let report = stream.join().unwrap().unwrap();
        thread::sleep(Duration::from_millis(300));
        let new_maps = Maps::open_pinned(&pin_dir).unwrap();
        let after = counters(&lab, &[("", &old_maps), ("_new", &new_maps)]);
        let before = counters_with_new(before, &after);
        let w = Window { what, sent: report.packets, received: received(&before, &after), pps: report.pps };
        println!(
            "MEASURED: {what} at {:.2} Mpps: sent {}, received {}, lost {}",
            w.pps / 1e6,
            w.sent,
            w.received,
            w.sent as i64 - w.received
        );
        if w.received != w.sent as i64 {
            println!("what moved during \"{what}\":\n{}", changed(&before, &after));
        }
        w
    };

    // A window that lost nothing but ran below 1 Mpps (the machine was
    // busy) proves nothing either way: measure it again, up to
    // MAX_ATTEMPTS times. A window that lost a packet is never re-measured.
    let window = |what: &'static str, change: &mut dyn FnMut()| -> Window {
        let mut attempt = 1;
        loop {
            let w = measure(what, change);
            if w.pps >= MIN_PPS || w.received != w.sent as i64 || attempt == MAX_ATTEMPTS {
                return w;
            }
            println!(
                "MEASURED: {what}: below 1 Mpps without loss; attempt {attempt} of {MAX_ATTEMPTS}, measuring again"
            );
            attempt += 1;
        }
    };

    let mut first = Some(lab.start_dataplane(&rocev2_bin(), &config).unwrap());
    let _ = measure("warm-up (not counted)", &mut || {});
    let mut windows = vec![window("no change (baseline)", &mut || {})];

    // 1. A member leaves the group and comes back (`rocev2 reload`, then SIGHUP).
    let smaller = text.replace(&format!("  {{ dev = \"u4\", mac = \"{}\" }},\n", format_mac(&uplink_mac(4))), "");
    assert_ne!(smaller, text);
    let members = |lab: &EcmpLab| RunState::read(&lab.pin_dir()).unwrap().groups[0].members.len();
    windows.push(window("reloads removing and restoring a member", &mut || {
        std::fs::write(&config, &smaller).unwrap();
        reload(&config);
        assert_eq!(members(&lab), UPLINKS - 1);
        thread::sleep(Duration::from_millis(300));
        std::fs::write(&config, &text).unwrap();
        let pid = RunState::read(&lab.pin_dir()).unwrap().pid;
        let reloads = RunState::read(&lab.pin_dir()).unwrap().reloads;
        // SAFETY: kill(2) on the pid `rocev2 run` published.
        unsafe { libc::kill(pid as i32, libc::SIGHUP) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while RunState::read(&lab.pin_dir()).unwrap().reloads == reloads {
            assert!(Instant::now() < deadline, "SIGHUP reload not done within 10 s");
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(members(&lab), UPLINKS);
    }));

    // 2. Routes: a more specific route for the stream's destination to a
    //    new group of two members (traffic moves to it), the same route
    //    retargeted to the four-member group, then the route and the
    //    group removed (traffic falls back to 10.1.0.0/16).
    let pair_group = format!(
        "\n[[group]]\nname = \"pair\"\nmembers = [\n  {{ dev = \"u1\", mac = \"{}\" }},\n  {{ dev = \"u2\", mac = \"{}\" }},\n]\n",
        format_mac(&uplink_mac(1)),
        format_mac(&uplink_mac(2))
    );
    let specific = |group: &str| format!("\n[[route]]\nprefix = \"10.1.0.0/24\"\ngroup = \"{group}\"\n");
    let with_pair = format!("{text}{pair_group}{}", specific("pair"));
    let retargeted = format!("{text}{pair_group}{}", specific("spines"));
    let stats = |lab: &EcmpLab| -> serde_json::Value {
        let out = rocev2(&["stats", "--json", "--pin-dir", lab.pin_dir().to_str().unwrap()]);
        assert!(out.status.success(), "stats: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let group_packets = |s: &serde_json::Value, name: &str| -> u64 {
        s["groups"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| g["name"] == name)
            .flat_map(|g| g["members"].as_array().unwrap().iter())
            .map(|m| m["packets"].as_u64().unwrap())
            .sum()
    };
    windows.push(window("reloads adding, retargeting and removing a route", &mut || {
        std::fs::write(&config, &with_pair).unwrap();
        reload(&config);
        thread::sleep(Duration::from_millis(200));
        let s = stats(&lab);
        assert!(group_packets(&s, "pair") > 0, "traffic took the new /24 route to group pair: {s}");
        std::fs::write(&config, &retargeted).unwrap();
        reload(&config);
        thread::sleep(Duration::from_millis(200));
        std::fs::write(&config, &text).unwrap();
        reload(&config);
        assert_eq!(RunState::read(&lab.pin_dir()).unwrap().groups.len(), 1);
    }));

    // 3. Handover: SIGUSR1 leaves the programs attached and the maps
    //    pinned; a new `rocev2 run` loads its own and swaps them in.
    windows.push(window("handover to a new rocev2 run", &mut || {
        let started = Instant::now();
        let pid = RunState::read(&lab.pin_dir()).unwrap().pid;
        // SAFETY: kill(2) on the pid `rocev2 run` published.
        unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
        let out = first.take().unwrap().stop_after_exit(Duration::from_secs(10)).unwrap();
        assert!(out.contains("handed over"), "{out}");
        let second = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
        assert!(second.output().contains("took over p0"), "{}", second.output());
        // Printed per attempt: a retried window shows every takeover.
        println!(
            "MEASURED: handover: the new rocev2 run took over {:.2} s after SIGUSR1 to the old one",
            started.elapsed().as_secs_f64()
        );
        first = Some(second);
    }));

    // 4. `rocev2 upgrade` (what the package runs on upgrade): the same
    //    handover in one step; outside systemd the upgrade process becomes
    //    the new `rocev2 run`.
    windows.push(window("rocev2 upgrade", &mut || {
        let mut cmd = std::process::Command::new(rocev2_bin());
        cmd.args(["upgrade", "--pin-dir", lab.pin_dir().to_str().unwrap()]);
        let upgraded = rocev2_user::testbed::ecmp_lab::DataplaneProcess::spawn(cmd).unwrap();
        let out = first.take().unwrap().stop_after_exit(Duration::from_secs(10)).unwrap();
        assert!(out.contains("handed over"), "{out}");
        assert!(upgraded.output().contains("took over p0"), "{}", upgraded.output());
        first = Some(upgraded);
    }));
    first.take().unwrap().stop().unwrap();

    for w in &windows {
        assert!(
            w.pps >= MIN_PPS,
            "{}: the stream ran at {:.3} Mpps, below the 1 Mpps this test is about (a busy machine?)",
            w.what,
            w.pps / 1e6
        );
        assert_eq!(
            w.received,
            w.sent as i64,
            "{}: lost {} of {} packets at {:.2} Mpps",
            w.what,
            w.sent as i64 - w.received,
            w.sent,
            w.pps / 1e6
        );
    }
}

/// `before` with zeros for the counters of a dataplane instance that
/// started during the window (its maps did not exist yet).
fn counters_with_new(mut before: Counters, after: &Counters) -> Counters {
    for k in after.keys() {
        before.entry(k.clone()).or_insert(0);
    }
    before
}
