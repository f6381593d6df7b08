//! Host bridge mode end to end: `rocev2 lab up --host-bridge` (a host → a
//! Linux bridge with the real `rocev2 run` in bridge mode → four rack
//! switches sharing one anycast gateway MAC and address → the destination),
//! and a small STP topology of two bridges. Frames are sent and captured
//! with packet sockets: every frame must arrive once and byte for byte as
//! it was sent (a bridge changes nothing).

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

use rocev2_common::bth::{opcode, Bth};
use rocev2_tests::{require_root, rocev2_bin, LabGuard};
use rocev2_user::{
    sys::{
        format_mac,
        netns::{self, ip, spawn_in_netns, Netns},
        rawsock::PacketSocket,
    },
    testbed::{
        ecmp_lab::DataplaneProcess,
        lab::{
            self,
            hostbridge::{host_mac, GATEWAY_MAC},
            LabFamily, LabRouting, LabUpArgs,
        },
    },
    tools::packet::{build_roce_frame, parse_roce, RoceFrameSpec},
};

const UPLINKS: usize = 4;
const QPS: u32 = 64;

/// A lab name unique to this process and tag: 1-8 of [a-z0-9].
fn lab_name(tag: char) -> String {
    let mut pid = std::process::id();
    let mut base36 = String::new();
    while pid > 0 {
        base36.insert(0, std::char::from_digit(pid % 36, 36).unwrap());
        pid /= 36;
    }
    let name = format!("b{tag}{base36}");
    name[..name.len().min(8)].to_owned()
}

/// A host bridge lab that `lab down` removes when the test ends.
struct Lab {
    name: String,
    config: PathBuf,
    pin_dir: PathBuf,
    _guard: LabGuard,
}

impl Lab {
    fn up(tag: char, hosts: u32) -> Lab {
        require_root();
        let name = lab_name(tag);
        let args = LabUpArgs {
            name: name.clone(),
            hosts,
            spines: 2,
            links_per_spine: 1,
            family: LabFamily::Both,
            hash: rocev2_common::hash::HashMode::Qp,
            hash_version: rocev2_common::hash::HashVersion::V1,
            config_out: None,
            routing: LabRouting::Static,
            racks: None,
            seed: rocev2_user::tools::fabric::SeedPlan::Auto,
            zones: 1,
            aggs: None,
            unnumbered: false,
            links: Default::default(),
            rdma: Default::default(),
            host_bridge: true,
            telemetry: false,
            uplinks: UPLINKS as u32,
        };
        let guard = LabGuard(name.clone());
        lab::up(&args).expect("lab up --host-bridge");
        let record = lab::LabRecord::read(&name).unwrap();
        Lab { config: record.config.clone().unwrap(), pin_dir: record.pin_dir.clone(), name, _guard: guard }
    }

    fn ns(&self, what: &str) -> String {
        format!("{}-{what}", self.name)
    }

    fn start(&self) -> DataplaneProcess {
        DataplaneProcess::start(&rocev2_bin(), &self.ns("bridge"), &self.config).expect("rocev2 run in bridge mode")
    }

    fn stats(&self) -> serde_json::Value {
        let out = std::process::Command::new(rocev2_bin())
            .args(["stats", "--json", "--pin-dir"])
            .arg(&self.pin_dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "rocev2 stats: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// `ip -n <lab>-<what> ARGS`.
    fn ip(&self, what: &str, args: &[&str]) -> String {
        let ns = self.ns(what);
        let mut full = vec!["-n", ns.as_str()];
        full.extend_from_slice(args);
        ip(&full).unwrap_or_else(|e| panic!("ip {full:?}: {e:#}"))
    }
}

/// A port counter of `port` in `rocev2 stats --json`.
fn port_counter(stats: &serde_json::Value, port: &str, counter: &str) -> u64 {
    let ports = stats["ports"].as_array().expect("ports");
    let p = ports.iter().find(|p| p["name"] == port).unwrap_or_else(|| panic!("no port {port} in {stats}"));
    p["counters"][counter].as_u64().unwrap_or(0)
}

/// Packets per member of the uplink group, by port name.
fn member_packets(stats: &serde_json::Value) -> BTreeMap<String, u64> {
    let group = stats["groups"].as_array().unwrap().iter().find(|g| g["name"] == "gateways").expect("gateways group");
    group["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["dev"].as_str().unwrap().to_string(), m["packets"].as_u64().unwrap()))
        .collect()
}

/// One frame from host 1 to the destination through the gateway.
fn host_frame(qp: u32, psn: u32) -> Vec<u8> {
    build_roce_frame(&RoceFrameSpec {
        src_mac: host_mac(1),
        dst_mac: GATEWAY_MAC,
        vlan: None,
        src_ip: "10.0.1.1".parse().unwrap(),
        dst_ip: lab::DEST_V4.parse().unwrap(),
        ttl: 64,
        dscp: 26,
        ecn: 2,
        src_port: 0xC000,
        bth: Bth::new(opcode::WRITE_MIDDLE, qp, psn),
        payload_len: 64,
    })
}

/// `packets` frames on each of QPS QPs (0x100...), all on one UDP source port.
fn host_frames(packets: u32) -> Vec<Vec<u8>> {
    (0..packets).flat_map(|psn| (0..QPS).map(move |q| host_frame(0x100 + q, psn))).collect()
}

/// Sends `frames` out of `dev` in namespace `ns`, a short pause every 32
/// so no veth ring or capture overflows.
fn send(ns: &str, dev: &str, frames: Vec<Vec<u8>>) {
    let device = dev.to_string();
    netns::in_netns(ns, move || {
        let socket = PacketSocket::open(&device)?;
        for (i, f) in frames.iter().enumerate() {
            socket.send(f)?;
            if i % 32 == 31 {
                thread::sleep(Duration::from_millis(1));
            }
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("sending from {ns}/{dev}: {e:#}"));
}

/// What one capture thread returns: the RoCEv2 frames it saw, and how many
/// frames the socket itself dropped.
type Captured = anyhow::Result<(Vec<Vec<u8>>, u64)>;

/// Packet-socket captures of RoCEv2 frames on several interfaces.
struct Capture {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<Captured>>,
}

impl Capture {
    fn start(places: &[(String, &str)]) -> Capture {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut threads = Vec::new();
        for (ns, dev) in places {
            let (stop, ready, dev) = (stop.clone(), ready_tx.clone(), dev.to_string());
            threads.push(
                spawn_in_netns(ns, move || {
                    let socket = PacketSocket::open(&dev)?;
                    ready.send(()).ok();
                    let mut frames = Vec::new();
                    let mut buf = vec![0u8; 16384];
                    while !stop.load(Ordering::Relaxed) {
                        match socket.recv(&mut buf, Duration::from_millis(50)) {
                            Ok(Some(n)) if parse_roce(&buf[..n]).is_ok() => frames.push(buf[..n].to_vec()),
                            Ok(_) => {}
                            Err(e) if e.raw_os_error() == Some(libc::ENETDOWN) => {
                                thread::sleep(Duration::from_millis(20))
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                    Ok((frames, socket.drops()?))
                })
                .unwrap(),
            );
        }
        for _ in places {
            ready_rx.recv_timeout(Duration::from_secs(10)).expect("a capture did not start");
        }
        Capture { stop, threads }
    }

    /// What each interface received, in `start`'s order (after letting
    /// frames in flight land). A capture that dropped fails the test: it
    /// would count the observer's loss as the dataplane's.
    fn finish(self) -> Vec<Vec<Vec<u8>>> {
        thread::sleep(Duration::from_millis(300));
        self.stop.store(true, Ordering::Relaxed);
        self.threads
            .into_iter()
            .map(|t| {
                let (frames, drops) = t.join().unwrap().unwrap();
                assert_eq!(drops, 0, "the capture itself dropped frames (the machine is too busy?)");
                frames
            })
            .collect()
    }
}

/// The rack switches' gateway interfaces, in uplink order.
fn gateways(lab: &Lab) -> Vec<(String, &'static str)> {
    (1..=UPLINKS).map(|k| (lab.ns(&format!("rtsw{k}")), "gw")).collect()
}

/// The DestQP of a RoCEv2 frame.
fn qp_of(frame: &[u8]) -> u32 {
    parse_roce(frame).unwrap().bth.dest_qp
}

/// Sends the host's 64 QPs and returns what each rack switch received;
/// asserts every frame arrived exactly once and unchanged.
fn send_host_qps(lab: &Lab, packets: u32) -> Vec<Vec<Vec<u8>>> {
    let capture = Capture::start(&gateways(lab));
    let frames = host_frames(packets);
    send(&lab.ns("h1"), "eth0", frames.clone());
    let got = capture.finish();
    let mut arrived: Vec<Vec<u8>> = got.iter().flatten().cloned().collect();
    let mut sent = frames;
    arrived.sort();
    sent.sort();
    assert_eq!(arrived.len(), sent.len(), "every frame arrives exactly once");
    assert!(arrived == sent, "every frame arrives byte for byte as sent (TTL, MACs, IPv4 checksum, ICRC)");
    got
}

/// Which rack switch (0-based) each QP went to; each QP to exactly one.
fn qp_uplinks(got: &[Vec<Vec<u8>>]) -> BTreeMap<u32, usize> {
    let mut map = BTreeMap::new();
    for (k, frames) in got.iter().enumerate() {
        for f in frames {
            if let Some(before) = map.insert(qp_of(f), k) {
                assert_eq!(before, k, "QP {:#x} took two uplinks", qp_of(f));
            }
        }
    }
    map
}

fn active_uplinks(got: &[Vec<Vec<u8>>]) -> usize {
    got.iter().filter(|f| !f.is_empty()).count()
}

/// Done when: 64 QPs on one UDP source port use all four uplinks with
/// rocev2 (`qp`) and one with the kernel bridge alone, every frame intact;
/// traffic back is forwarded in XDP by the FDB; ARP and ND between the host
/// and the gateway still work, through the kernel bridge.
#[test]
fn qps_spread_over_every_uplink_with_rocev2_and_take_one_with_the_kernel_bridge_alone() {
    let lab = Lab::up('a', 1);
    // The kernel bridge alone. The rack switches announce their new
    // addresses (MLD) for a second or two, each teaching the bridge the
    // gateway's MAC on its own port: let that pass. Then one frame: the
    // destination's answer (ICMP, back through rack switch 1) settles
    // where the bridge has the gateway, as any traffic would.
    wait_quiet(&lab);
    send(&lab.ns("h1"), "eth0", vec![host_frame(0x1, 0)]);
    thread::sleep(Duration::from_millis(300));
    let alone = send_host_qps(&lab, 4);
    let per_uplink: Vec<usize> = alone.iter().map(Vec::len).collect();
    assert_eq!(
        active_uplinks(&alone),
        1,
        "the kernel bridge sends every QP to the port it learned the gateway on: {per_uplink:?}"
    );

    let run = lab.start();
    learn_host(&lab);
    let counted_before = member_packets(&lab.stats());
    let spread = send_host_qps(&lab, 4);
    assert_eq!(active_uplinks(&spread), UPLINKS, "rocev2 spreads the QPs over every uplink");
    let counted = member_packets(&lab.stats());
    for (k, frames) in spread.iter().enumerate() {
        let member = format!("u{}", k + 1);
        let delta = counted[&member] - counted_before[&member];
        assert_eq!(delta, frames.len() as u64, "member counter of {member} vs arrivals");
    }

    // Back from the destination through each rack switch, to the host.
    let back = Capture::start(&[(lab.ns("h1"), "eth0")]);
    for k in 1..=UPLINKS as u8 {
        let frames: Vec<Vec<u8>> = (0..20)
            .map(|psn| {
                build_roce_frame(&RoceFrameSpec {
                    src_mac: [0x02, 0x52, 0x32, 0x14, 0x00, k],
                    dst_mac: [0x02, 0x52, 0x32, 0x13, 0x00, k],
                    vlan: None,
                    src_ip: lab::DEST_V4.parse().unwrap(),
                    dst_ip: "10.0.1.1".parse().unwrap(),
                    ttl: 64,
                    dscp: 26,
                    ecn: 2,
                    src_port: 0xC000,
                    bth: Bth::new(opcode::ACK, 0x100 + u32::from(k), psn),
                    payload_len: 4,
                })
            })
            .collect();
        send(&lab.ns("dst"), &format!("r{k}"), frames);
    }
    let back = back.finish().remove(0);
    assert_eq!(back.len(), 20 * UPLINKS, "every frame from the rack switches reaches the host");
    for f in &back {
        let p = parse_roce(f).unwrap();
        assert!(p.icrc_ok && p.ipv4_checksum_ok == Some(true), "intact");
        assert_eq!(p.ttl_or_hop_limit, 63, "routed once, by the rack switch; the bridge leaves the TTL");
        assert_eq!((f[0..6] == host_mac(1), f[6..12] == GATEWAY_MAC), (true, true), "MACs as the rack switch wrote");
    }
    let stats = lab.stats();
    for k in 1..=UPLINKS {
        let port = format!("u{k}");
        assert!(port_counter(&stats, &port, "bridged_to_port") >= 20, "{port}: forwarded in XDP by the FDB");
    }

    // ARP and ND: the host forgets the gateway and resolves it again.
    let before = lab.stats();
    lab.ip("h1", &["neigh", "flush", "all"]);
    for gateway in ["10.0.1.254", "fd00:1::fe"] {
        let addr: IpAddr = gateway.parse().unwrap();
        let mac = netns::in_netns(&lab.ns("h1"), move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async {
                let netlink = rocev2_user::sys::netlink::Netlink::new()?;
                let eth0 = netlink.link("eth0").await?;
                netlink.resolve_neighbour(eth0.ifindex, addr, Duration::from_secs(3)).await
            })
        })
        .unwrap_or_else(|e| panic!("the host resolves the gateway {gateway}: {e:#}"));
        assert_eq!(mac, GATEWAY_MAC, "{gateway} resolves to the anycast gateway's MAC");
    }
    let after = lab.stats();
    let delta = |port: &str, c: &str| port_counter(&after, port, c) - port_counter(&before, port, c);
    assert!(delta("h1", "pass_l2_multicast") >= 2, "the ARP request and the NS went to the kernel bridge");
    let replies: u64 = (1..=UPLINKS).map(|k| delta(&format!("u{k}"), "pass_not_ip")).sum();
    assert!(replies >= 1, "the ARP replies went to the kernel bridge (pass_not_ip)");
    let output = run.stop().unwrap();
    assert!(output.contains("following bridge br0"), "{output}");
}

/// A steady stream of prebuilt frames, sent in order at a fixed rate;
/// the send time of each frame sent is recorded. After a stall the frames
/// missed are skipped (never sent) rather than sent in one burst that
/// would overflow the veth rings.
struct Stream {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<anyhow::Result<Vec<(usize, Instant)>>>,
}

impl Stream {
    fn start(ns: &str, dev: &str, pps: u32, frames: Vec<Vec<u8>>) -> Stream {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, dev) = (stop.clone(), dev.to_string());
        let handle = spawn_in_netns(ns, move || {
            let socket = PacketSocket::open(&dev)?;
            let start = Instant::now();
            let mut sent = Vec::with_capacity(frames.len());
            let mut i = 0usize;
            while !flag.load(Ordering::Relaxed) && i < frames.len() {
                let due = ((start.elapsed().as_secs_f64() * f64::from(pps)) as usize).min(frames.len());
                i = i.max(due.saturating_sub(32));
                while i < due {
                    socket.send(&frames[i])?;
                    sent.push((i, Instant::now()));
                    i += 1;
                }
                thread::sleep(Duration::from_micros(300));
            }
            Ok(sent)
        })
        .unwrap();
        Stream { stop, handle }
    }

    /// Stops; returns (frame index, send time) of every frame sent.
    fn stop(self) -> Vec<(usize, Instant)> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap().unwrap()
    }
}

/// Waits until the uplink group has `n` usable members (stats), or fails.
fn wait_members(lab: &Lab, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if member_packets(&lab.stats()).len() == n {
            return;
        }
        assert!(Instant::now() < deadline, "the uplink group never had {n} members: {}", lab.stats());
        thread::sleep(Duration::from_millis(50));
    }
}

/// Done when: an uplink goes down and only its QPs move, nothing else is
/// lost; it comes back and its QPs return. Then a reload and a takeover
/// in bridge mode lose nothing either.
#[test]
fn an_uplink_that_goes_down_moves_only_its_qps_and_gets_them_back() {
    let lab = Lab::up('b', 1);
    let run = lab.start();
    learn_host(&lab);
    let before = qp_uplinks(&send_host_qps(&lab, 2));
    let on_u2: Vec<u32> = before.iter().filter(|(_, k)| **k == 1).map(|(q, _)| *q).collect();
    let elsewhere: Vec<u32> = before.iter().filter(|(_, k)| **k != 1).map(|(q, _)| *q).collect();
    assert!(!on_u2.is_empty() && !elsewhere.is_empty(), "{before:?}");

    // The QPs of the other uplinks stream on while u2 goes down and back.
    let capture = Capture::start(&gateways(&lab));
    let frames = (0..8000u32).map(|i| host_frame(elsewhere[i as usize % elsewhere.len()], i)).collect();
    let stream = Stream::start(&lab.ns("h1"), "eth0", 4000, frames);
    thread::sleep(Duration::from_millis(200));
    lab.ip("bridge", &["link", "set", "u2", "down"]);
    wait_members(&lab, UPLINKS - 1);
    thread::sleep(Duration::from_millis(200));
    let sent = stream.stop().len();
    let streamed = capture.finish();
    assert_eq!(streamed.iter().map(Vec::len).sum::<usize>(), sent, "no frame of another uplink's QPs is lost");
    assert!(streamed[1].is_empty(), "u2 was never their uplink");

    let down = qp_uplinks(&send_host_qps(&lab, 2));
    for q in &elsewhere {
        assert_eq!(down[q], before[q], "QP {q:#x} was not on u2 and stays where it was");
    }
    for q in &on_u2 {
        assert_ne!(down[q], 1, "QP {q:#x} left u2");
    }
    lab.ip("bridge", &["link", "set", "u2", "up"]);
    wait_members(&lab, UPLINKS);
    let back = qp_uplinks(&send_host_qps(&lab, 2));
    assert_eq!(back, before, "u2 got exactly its own QPs back");

    // A reload (five-tuple hashing: one uplink) and back, then a takeover
    // by a new `rocev2 run`: under a stream, nothing lost.
    let config = std::fs::read_to_string(&lab.config).unwrap();
    std::fs::write(&lab.config, config.replace("hash = \"qp\"", "hash = \"five-tuple\"")).unwrap();
    reload(&lab);
    assert_eq!(active_uplinks(&send_host_qps(&lab, 1)), 1, "five-tuple hashing puts one source port on one uplink");
    std::fs::write(&lab.config, &config).unwrap();
    reload(&lab);
    let capture = Capture::start(&gateways(&lab));
    let frames = (0..24000u32).map(|i| host_frame(0x100 + i % QPS, i)).collect();
    let stream = Stream::start(&lab.ns("h1"), "eth0", 4000, frames);
    thread::sleep(Duration::from_millis(200));
    let pid = run.pid().unwrap();
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    let first = run.stop_after_exit(Duration::from_secs(10)).unwrap();
    assert!(first.contains("handed over"), "{first}");
    let second = lab.start();
    thread::sleep(Duration::from_millis(300));
    let sent = stream.stop().len();
    let got = capture.finish();
    assert_eq!(got.iter().map(Vec::len).sum::<usize>(), sent, "the takeover lost nothing");
    let output = second.stop().unwrap();
    assert!(output.contains("took over h1"), "{output}");
}

fn reload(lab: &Lab) {
    let out = std::process::Command::new(rocev2_bin()).args(["reload", "--config"]).arg(&lab.config).output().unwrap();
    assert!(out.status.success(), "rocev2 reload: {}", String::from_utf8_lossy(&out.stderr));
}

/// `count` frames from the destination to `dst` (an address the host's
/// MAC answers for) through rack switch 1, PSN = frame number.
fn to_host(dst: &str, qp: u32, count: u32) -> Vec<Vec<u8>> {
    (0..count)
        .map(|psn| {
            build_roce_frame(&RoceFrameSpec {
                src_mac: [0x02, 0x52, 0x32, 0x14, 0x00, 1],
                dst_mac: [0x02, 0x52, 0x32, 0x13, 0x00, 1],
                vlan: None,
                src_ip: lab::DEST_V4.parse().unwrap(),
                dst_ip: dst.parse().unwrap(),
                ttl: 64,
                dscp: 26,
                ecn: 2,
                src_port: 0xC000,
                bth: Bth::new(opcode::WRITE_MIDDLE, qp, psn),
                payload_len: 64,
            })
        })
        .collect()
}

fn psns(frames: &[Vec<u8>]) -> Vec<u32> {
    frames.iter().map(|f| parse_roce(f).unwrap().bth.psn).collect()
}

/// Done when: an FDB entry that moves to another port (the host moves)
/// takes the traffic with it within 100 ms, nothing lost; an entry that
/// ages out sends frames to the kernel, which floods them (counted):
/// never a black hole.
#[test]
fn traffic_follows_a_host_that_moves_and_an_aged_out_entry_floods() {
    let lab = Lab::up('c', 1);
    // The host's second link, on a second bridge port, with the same MAC.
    let h1 = lab.ns("h1");
    lab.ip("bridge", &["link", "add", "h1b", "type", "veth", "peer", "name", "eth1", "netns", &h1]);
    // No IPv6 on either link: the host's own announcements (MLD, ND)
    // would teach the bridge where it is before and after the test does.
    for dev in ["eth0", "eth1"] {
        ip(&["netns", "exec", &h1, "sysctl", "-qw", &format!("net.ipv6.conf.{dev}.disable_ipv6=1")]).unwrap();
    }
    lab.ip("h1", &["link", "set", "eth1", "address", &format_mac(&host_mac(1)), "up"]);
    lab.ip("bridge", &["link", "set", "h1b", "master", "br0", "up"]);
    // Frames to an address that is not the host's own: its kernel drops
    // them without an answer, which would teach the bridge where it is.
    const TO: &str = "10.0.1.77";
    lab.ip("rtsw1", &["neigh", "add", TO, "lladdr", &format_mac(&host_mac(1)), "dev", "gw", "nud", "permanent"]);
    let run = lab.start();
    send(&h1, "eth0", vec![host_frame(0x1, 0)]);
    thread::sleep(Duration::from_millis(100));

    let capture = Capture::start(&[(h1.clone(), "eth0"), (h1.clone(), "eth1")]);
    let stream = Stream::start(&lab.ns("dst"), "r1", 5000, to_host(TO, 0x77, 20_000));
    thread::sleep(Duration::from_millis(300));
    assert!(fdb_port(&lab.ns("bridge"), &host_mac(1)).as_deref() == Some("h1"), "the host starts on h1");
    // The host moves: a frame from its MAC on the new link (to the
    // gateway). XDP hands it to the kernel bridge, which learns the move;
    // rocev2 follows it.
    // From before the frame is sent (so the time includes sending it).
    let moved = Instant::now();
    send(&h1, "eth1", vec![host_frame(0x1, 0)]);
    thread::sleep(Duration::from_millis(500));
    let sent = stream.stop();
    let got = capture.finish();
    let (old, new) = (psns(&got[0]), psns(&got[1]));
    assert!(!new.is_empty(), "the traffic followed the host to its new port");
    // When was the last frame that still went to the old port sent?
    let sent_at: BTreeMap<u32, Instant> = sent.iter().map(|(i, t)| (*i as u32, *t)).collect();
    let last_old = old.iter().filter_map(|p| sent_at.get(p)).max().copied().unwrap();
    let late = last_old.saturating_duration_since(moved);
    println!("the last frame to the old port was sent {late:?} after the move");
    assert!(late <= Duration::from_millis(100), "frames sent {late:?} after the move still went to the old port");
    let mut all: Vec<u32> = old.iter().chain(&new).copied().collect();
    all.sort_unstable();
    let mut want: Vec<u32> = sent_at.keys().copied().collect();
    want.sort_unstable();
    assert_eq!(all, want, "every frame arrived once, at one port or the other, while the host moved");
    let stats = lab.stats();
    assert!(port_counter(&stats, "h1b", "pass_bridge_learn") >= 1, "the move was learned by the kernel bridge");

    // Ageing: one second, the host stays silent, its entry goes.
    lab.ip("bridge", &["link", "set", "br0", "type", "bridge", "ageing_time", "100"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fdb_knows(&lab.ns("bridge"), &host_mac(1)) || lab.stats()["bridge"]["fdb_port"] != 0 {
        assert!(Instant::now() < deadline, "the host's entry never aged out (in the kernel and in rocev2's FDB)");
        thread::sleep(Duration::from_millis(100));
    }
    let before = lab.stats();
    let capture = Capture::start(&[(h1.clone(), "eth0"), (h1.clone(), "eth1")]);
    send(&lab.ns("dst"), "r1", to_host(TO, 0x78, 50));
    let got = capture.finish();
    let after = lab.stats();
    let unknown = port_counter(&after, "u1", "pass_bridge_unknown_unicast")
        - port_counter(&before, "u1", "pass_bridge_unknown_unicast");
    assert!(
        unknown >= 50,
        "frames to the aged-out host went to the kernel bridge, counted ({unknown}): {}",
        after["ports"]
    );
    assert_eq!(got[0].len(), 50, "and the kernel flooded them: the host still gets every one");
    run.stop().unwrap();
}

/// Whether the bridge's FDB (`bridge fdb show`) has `mac` on some port.
fn fdb_knows(ns: &str, mac: &[u8; 6]) -> bool {
    fdb_port(ns, mac).is_some()
}

/// The port the bridge's FDB has `mac` on.
fn fdb_port(ns: &str, mac: &[u8; 6]) -> Option<String> {
    let out = std::process::Command::new("bridge").args(["-n", ns, "fdb", "show", "br", "br0"]).output().unwrap();
    let prefix = format!("{} dev ", format_mac(mac));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with(&prefix))?;
    line[prefix.len()..].split_whitespace().next().map(str::to_string)
}

/// Waits until no frame has reached the bridge from a rack switch for a
/// second (at most 10 s).
fn wait_quiet(lab: &Lab) {
    let bridge = lab.ns("bridge");
    let received =
        || -> u64 { (1..=UPLINKS).map(|i| netns::device_counts(&bridge, &format!("u{i}")).unwrap().rx.packets).sum() };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = received();
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(1) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(100));
        let now = received();
        if now != last {
            (last, quiet_since) = (now, Instant::now());
        }
    }
}

/// Makes sure the bridge knows host 1 (its first frame goes to the kernel
/// bridge, which learns it; the frames after it are rocev2's): one frame,
/// then wait until rocev2's FDB has the host.
fn learn_host(lab: &Lab) {
    send(&lab.ns("h1"), "eth0", vec![host_frame(0x1, 0)]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while lab.stats()["bridge"]["fdb_port"].as_u64() == Some(0) {
        assert!(Instant::now() < deadline, "rocev2's FDB never learned the host");
        thread::sleep(Duration::from_millis(50));
    }
}

/// The STP topology: a bridge box (`br0`, rocev2) with a host and two
/// links to a peer bridge (the STP root, so one of the two links blocks)
/// behind which sits a far host. Kernel STP with the shortest timers
/// (forward delay 2 s).
struct StpLab {
    tag: String,
    _namespaces: Vec<Netns>,
    config: PathBuf,
}

const FAR_MAC: [u8; 6] = [0x02, 0x52, 0x32, 0x30, 0x00, 0x02];
const NEAR_MAC: [u8; 6] = [0x02, 0x52, 0x32, 0x30, 0x00, 0x01];

impl StpLab {
    fn build() -> StpLab {
        require_root();
        let tag = netns::unique_name("bs");
        let ns = |what: &str| format!("{tag}-{what}");
        let namespaces: Vec<Netns> =
            ["box", "peer", "near", "far"].iter().map(|n| Netns::create(&ns(n)).unwrap()).collect();
        let stp =
            ["type", "bridge", "stp_state", "1", "forward_delay", "200", "hello_time", "100", "mcast_snooping", "0"];
        let run = |args: &[&str]| ip(args).unwrap_or_else(|e| panic!("ip {args:?}: {e:#}"));
        run(&[&["-n", &ns("box"), "link", "add", "br0"], &stp[..]].concat());
        run(&[&["-n", &ns("peer"), "link", "add", "peer"], &stp[..], &["priority", "4096"]].concat());
        for (a, a_ns, b, b_ns) in [
            ("x1", "box", "y1", "peer"),
            ("x2", "box", "y2", "peer"),
            ("hp", "box", "eth0", "near"),
            ("fp", "peer", "eth0", "far"),
        ] {
            run(&["-n", &ns(a_ns), "link", "add", a, "type", "veth", "peer", "name", b, "netns", &ns(b_ns)]);
        }
        run(&["-n", &ns("near"), "link", "set", "eth0", "address", &format_mac(&NEAR_MAC), "up"]);
        run(&["-n", &ns("far"), "link", "set", "eth0", "address", &format_mac(&FAR_MAC), "up"]);
        for (n, bridge, ports) in [("box", "br0", ["x1", "x2", "hp"]), ("peer", "peer", ["y1", "y2", "fp"])] {
            for p in ports {
                run(&["-n", &ns(n), "link", "set", p, "master", bridge, "up"]);
            }
            run(&["-n", &ns(n), "link", "set", bridge, "up"]);
        }
        let pin = rocev2_user::sys::paths::pin_dir_named(&tag);
        let config = PathBuf::from(format!("/tmp/rocev2-{tag}.toml"));
        std::fs::write(
            &config,
            format!(
                "[dataplane]\npin_dir = \"{}\"\n\n[bridge]\nname = \"br0\"\n\n[[uplink_group]]\nname = \"peer\"\nports = [\"x1\", \"x2\"]\nmacs = [\"{}\"]\n",
                pin.display(),
                format_mac(&FAR_MAC)
            ),
        )
        .unwrap();
        StpLab { tag, _namespaces: namespaces, config }
    }

    fn ns(&self, what: &str) -> String {
        format!("{}-{what}", self.tag)
    }

    /// The STP state of a port of br0, as `bridge link` prints it.
    fn state(&self, port: &str) -> String {
        let out = std::process::Command::new("bridge")
            .args(["-n", &self.ns("box"), "link", "show", "dev", port])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.split(" state ").nth(1).and_then(|s| s.split_whitespace().next()).unwrap_or("none").to_string()
    }

    fn wait_state(&self, port: &str, state: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.state(port) != state {
            assert!(Instant::now() < deadline, "{port} never reached STP state {state} (it is {})", self.state(port));
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// `count` frames from the near host to the far host, and what each of
    /// the peer's two ports (y1, y2) received.
    fn send(&self, count: u32, first_psn: u32) -> [usize; 2] {
        let capture = Capture::start(&[(self.ns("peer"), "y1"), (self.ns("peer"), "y2")]);
        let frames = (first_psn..first_psn + count)
            .map(|psn| {
                build_roce_frame(&RoceFrameSpec {
                    src_mac: NEAR_MAC,
                    dst_mac: FAR_MAC,
                    vlan: None,
                    src_ip: "10.9.0.1".parse().unwrap(),
                    dst_ip: "10.9.0.2".parse().unwrap(),
                    ttl: 64,
                    dscp: 26,
                    ecn: 2,
                    src_port: 0xC000,
                    bth: Bth::new(opcode::WRITE_MIDDLE, 0x100 + psn % 16, psn),
                    payload_len: 64,
                })
            })
            .collect();
        send(&self.ns("near"), "eth0", frames);
        let got = capture.finish();
        [got[0].len(), got[1].len()]
    }
}

impl Drop for StpLab {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.config);
    }
}

/// Done when: a port in STP blocking state gets no frame from rocev2. The
/// peer bridge is the root, so of br0's two links to it x1 forwards and x2
/// blocks: an uplink group over both sends only by x1, and a static entry
/// on x2 is left to the kernel (which drops it there). When x1 fails, x2
/// goes through listening and learning (nothing sent by it) and then
/// forwards (everything by it).
#[test]
fn a_port_outside_stp_forwarding_state_gets_no_frame() {
    let lab = StpLab::build();
    lab.wait_state("x1", "forwarding");
    lab.wait_state("x2", "blocking");
    let run = DataplaneProcess::start(&rocev2_bin(), &lab.ns("box"), &lab.config).expect("rocev2 run");
    let box_ns = lab.ns("box");
    let bridge = |args: &[&str]| {
        let out =
            std::process::Command::new("bridge").args([&["-n", box_ns.as_str()], args].concat()).output().unwrap();
        assert!(out.status.success(), "bridge {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    // The near host's first frame teaches the bridge where it is.
    lab.send(1, 0);
    thread::sleep(Duration::from_millis(200));
    assert_eq!(lab.send(200, 1), [200, 0], "every frame by x1, none by the blocking x2");
    let stats_of = || -> serde_json::Value {
        let out = std::process::Command::new(rocev2_bin())
            .args(["stats", "--json", "--config"])
            .arg(&lab.config)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let stats = stats_of();
    let members: Vec<&str> =
        stats["groups"][0]["members"].as_array().unwrap().iter().map(|m| m["dev"].as_str().unwrap()).collect();
    assert_eq!(members, ["x1"], "the blocking port is no member");

    // A host the FDB has behind the blocking port: rocev2 leaves it to the
    // kernel (counted), which does not send by a blocking port either.
    const BEHIND_X2: [u8; 6] = [0x02, 0x52, 0x32, 0x30, 0x00, 0x09];
    bridge(&["fdb", "add", &format_mac(&BEHIND_X2), "dev", "x2", "master", "static"]);
    thread::sleep(Duration::from_millis(200));
    let capture = Capture::start(&[(lab.ns("peer"), "y1"), (lab.ns("peer"), "y2")]);
    let mut frame = build_roce_frame(&RoceFrameSpec {
        src_mac: NEAR_MAC,
        dst_mac: BEHIND_X2,
        vlan: None,
        src_ip: "10.9.0.1".parse().unwrap(),
        dst_ip: "10.9.0.9".parse().unwrap(),
        ttl: 64,
        dscp: 26,
        ecn: 2,
        src_port: 0xC000,
        bth: Bth::new(opcode::WRITE_MIDDLE, 0x300, 0),
        payload_len: 64,
    });
    send(&lab.ns("near"), "eth0", vec![frame.clone(); 50]);
    let got = capture.finish();
    assert_eq!((got[0].len(), got[1].len()), (0, 0), "nothing reaches the host behind the blocking port");
    let counter = |s: &serde_json::Value, c: &str| port_counter(s, "hp", c);
    assert!(counter(&stats_of(), "pass_bridge_egress_blocked") >= 50, "left to the kernel, counted");
    frame.clear();

    // x1 fails: x2 becomes the root port, listening then learning (2 s
    // each), then forwarding.
    ip(&["-n", &box_ns, "link", "set", "x1", "down"]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !matches!(lab.state("x2").as_str(), "listening" | "learning") {
        assert!(Instant::now() < deadline, "x2 never left blocking (it is {})", lab.state("x2"));
        thread::sleep(Duration::from_millis(20));
    }
    let state = lab.state("x2");
    let got = lab.send(100, 1000);
    let after = lab.state("x2");
    assert!(after != "forwarding", "x2 forwarded before the burst ended ({state} -> {after}): send faster");
    assert_eq!(got, [0, 0], "x2 gets nothing while {state}/{after}");
    lab.wait_state("x2", "forwarding");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let members = stats_of()["groups"][0]["members"].as_array().map_or(0, Vec::len);
        if members == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "x2 never joined the uplink group");
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(lab.send(100, 2000), [0, 100], "every frame by x2 once it forwards");
    let output = run.stop().unwrap();
    assert!(output.contains("member x2 bridge port rejoined group peer"), "{output}");
}

/// Bad input: a bridge that does not exist, a device that is not a
/// bridge, a port that is not in the bridge, a bond or VLAN this kernel
/// cannot make, a routed [[port]] on the bridge: each a clear error
/// naming the file, line and key, from `check` and from `run`.
#[test]
fn bridge_config_mistakes_are_named() {
    require_root();
    let tag = netns::unique_name("bb");
    let ns = Netns::create(&tag).unwrap();
    for args in [
        vec!["link", "add", "br0", "type", "bridge"],
        vec!["link", "add", "u1", "type", "veth", "peer", "name", "v1"],
        vec!["link", "add", "u2", "type", "veth", "peer", "name", "v2"],
        vec!["link", "add", "eth9", "type", "veth", "peer", "name", "v9"],
        vec!["link", "set", "u1", "master", "br0"],
        vec!["link", "set", "u2", "master", "br0"],
    ] {
        ip(&[&["-n", ns.name()], &args[..]].concat()).unwrap();
    }
    let path = PathBuf::from(format!("/tmp/rocev2-{tag}.toml"));
    let check = |text: &str| -> String {
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(rocev2_bin())
            .args(["--netns", ns.name(), "check", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!out.status.success(), "check accepted:\n{text}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let config = |bridge: &str, ports: &str| {
        format!("[bridge]\nname = \"{bridge}\"\n\n[[uplink_group]]\nname = \"up\"\nports = [{ports}]\nmacs = [\"02:00:5e:00:01:01\"]\n")
    };
    let e = check(&config("br9", "\"u1\", \"u2\""));
    assert!(
        e.contains(":2:8: bridge.name: no interface named br9") && e.contains("ip link add br9 type bridge"),
        "{e}"
    );
    // Nothing of it here (the wrong box or namespace): the bridge is named
    // with its ports, not only once they exist.
    let e = check(&config("br9", "\"x1\", \"x2\""));
    assert!(
        e.contains(":2:8: bridge.name: no interface named br9") && e.contains("ip link add br9 type bridge"),
        "{e}"
    );
    assert!(
        e.contains("uplink_group[0].ports[1]: no interface named x2") && e.contains("3 interfaces are missing"),
        "{e}"
    );
    // `explain` without --dst-mac on a bridge config: the routed answer,
    // and where the bridge's answer is.
    std::fs::write(&path, config("br0", "\"u1\", \"u2\"")).unwrap();
    let out = std::process::Command::new(rocev2_bin())
        .args(["explain", "--src", "10.0.1.1", "--dst", "10.1.0.1", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("frames on the ports of bridge br0 are decided by their destination MAC: give --dst-mac MAC"),
        "{said}"
    );
    let e = check(&config("u1", "\"u1\", \"u2\""));
    assert!(e.contains("bridge.name: u1 is not a Linux bridge (it is veth)"), "{e}");
    let e = check(&config("br0", "\"u1\", \"eth9\""));
    assert!(e.contains(":6:16: uplink_group[0].ports[1]: eth9 is not a port of bridge br0"), "{e}");
    let e = check(&config("br0", "\"u1\", \"bond0\""));
    assert!(e.contains("uplink_group[0].ports[1]: no interface named bond0") && e.contains("lack bonding"), "{e}");
    let e = check(&config("br0", "\"u1\", \"u2.100\""));
    assert!(e.contains("no interface named u2.100") && e.contains("802.1Q"), "{e}");
    let e = check(&config("br0", "\"u1\""));
    assert!(e.contains("uplink_group[0].ports: an uplink group needs at least two bridge ports"), "{e}");
    let e = check(&format!("[[port]]\nname = \"u2\"\n\n{}", config("br0", "\"u1\", \"u2\"")));
    assert!(e.contains("port[0]: u2 is a port of bridge br0, which [bridge] serves at layer 2"), "{e}");
    // `run` refuses the same way, before loading anything.
    std::fs::write(&path, config("br9", "\"u1\", \"u2\"")).unwrap();
    let out = std::process::Command::new(rocev2_bin())
        .args(["--netns", ns.name(), "run", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("bridge.name: no interface named br9"), "{e}");
    let _ = std::fs::remove_file(&path);
}
