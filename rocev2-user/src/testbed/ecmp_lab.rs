//! A small leaf-and-uplinks lab in network namespaces, used by `rocev2
//! demo` and by the netns tests: one sender host, the switch running the
//! dataplane, and N uplink namespaces that capture what reaches them.
//!
//! ```text
//!  [sender] snd0 --- p0 [switch: rocev2 run] u1 --- up0 [uplink 1]
//!   10.0.0.1          10.0.0.254              u2 --- up0 [uplink 2] ...
//! ```
//! Traffic goes to 10.1.0.1 / fd01::1, routed by the dataplane to the
//! `spines` group whose members are the uplinks.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{BufRead as _, BufReader},
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use rocev2_common::bth::{opcode, Bth};

use crate::{
    control::run::READY_LINE,
    render::{share_bar, Align, Table},
    sys::netns::{self, spawn_in_netns, unique_name, Netns},
    sys::rawsock::PacketSocket,
    testbed::arrival::{ArrivalProbe, LossAccount},
    testbed::topology::{build_topology, strs, NsPlan, VethPlan},
    tools::packet::{build_roce_frame, parse_roce, RoceFrameSpec},
};

pub const SENDER_MAC: [u8; 6] = [0x02, 0x52, 0x32, 0x00, 0x00, 0x01];
pub const SWITCH_PORT_MAC: [u8; 6] = [0x02, 0x52, 0x32, 0x00, 0x00, 0xFE];
/// The single UDP source port every QP uses: the low-entropy case.
pub const SHARED_SOURCE_PORT: u16 = 0xC000;
pub const DEST_V4: &str = "10.1.0.1";
pub const DEST_V6: &str = "fd01::1";
/// Hop limit the sender uses; forwarded packets must arrive one lower.
pub const SENT_TTL: u8 = 64;

/// The way back to the sender for RC replies (see [`EcmpLab::rc_config`]).
pub const RC_HOSTS: &str = "[[group]]\nname = \"hosts\"\nmembers = [ { dev = \"p0\", via = \"10.0.0.1\" } ]\n\n[[route]]\nprefix = \"10.0.0.1/32\"\ngroup = \"hosts\"\n";

fn switch_uplink_mac(i: usize) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x01, 0x00, i as u8]
}

/// MAC of uplink `i`'s far end (`up0` in its namespace).
pub fn uplink_mac(i: usize) -> [u8; 6] {
    [0x02, 0x52, 0x32, 0x02, 0x00, i as u8]
}

/// The namespaces and links of one lab; removed on drop.
pub struct EcmpLab {
    pub tag: String,
    pub sender: Netns,
    pub switch: Netns,
    pub uplinks: Vec<Netns>,
}

impl EcmpLab {
    pub fn create(uplinks: usize) -> Result<Self> {
        if uplinks == 0 || uplinks > 32 {
            bail!("uplinks must be 1..=32, not {uplinks}");
        }
        let tag = unique_name("r2");
        let (sender, switch) = (format!("{tag}-snd"), format!("{tag}-sw"));
        let mut namespaces = vec![NsPlan::new(&sender, false), NsPlan::new(&switch, false)];
        let mut links = vec![VethPlan {
            a_ns: sender.clone(),
            a_if: "snd0".into(),
            a_mac: SENDER_MAC,
            a_addrs: strs(&["10.0.0.1/24", "fd00::1/64"]),
            b_ns: switch.clone(),
            b_if: "p0".into(),
            b_mac: SWITCH_PORT_MAC,
            b_addrs: strs(&["10.0.0.254/24", "fd00::fe/64"]),
            gro_b: false,
        }];
        for i in 1..=uplinks {
            let up = format!("{tag}-up{i}");
            namespaces.push(NsPlan::new(&up, false));
            links.push(VethPlan {
                a_ns: switch.clone(),
                a_if: format!("u{i}"),
                a_mac: switch_uplink_mac(i),
                a_addrs: vec![format!("10.0.{i}.1/24"), format!("fd00:{i}::1/64")],
                b_ns: up,
                b_if: "up0".into(),
                b_mac: uplink_mac(i),
                b_addrs: vec![format!("10.0.{i}.2/24"), format!("fd00:{i}::2/64")],
                gro_b: false,
            });
        }
        // In plan order: the sender, the switch, then the uplinks.
        let mut made: Vec<Netns> = Vec::new();
        build_topology(&namespaces, &links, &mut made)?;
        let mut made = made.into_iter();
        let (Some(sender), Some(switch)) = (made.next(), made.next()) else {
            bail!("the topology build made fewer namespaces than planned");
        };
        Ok(Self { tag, sender, switch, uplinks: made.collect() })
    }

    /// Pin directory unique to this lab, so parallel labs never collide.
    pub fn pin_dir(&self) -> PathBuf {
        crate::sys::paths::pin_dir_named(&self.tag)
    }

    /// A dataplane config for the switch. Members use all three next-hop
    /// forms: IPv4 `via`, IPv6 `via` and a static MAC.
    pub fn config(&self, hash: &str) -> String {
        let mut members = String::new();
        for i in 1..=self.uplinks.len() {
            let next_hop = match i % 3 {
                1 => format!("via = \"10.0.{i}.2\""),
                2 => format!("via = \"fd00:{i}::2\""),
                _ => format!("mac = \"{}\"", crate::sys::format_mac(&uplink_mac(i))),
            };
            members.push_str(&format!("  {{ dev = \"u{i}\", {next_hop} }},\n"));
        }
        format!(
            "# Written by the rocev2 lab ({tag}).\n[dataplane]\nhash = \"{hash}\"\nhash_seed = 1234\nxdp_mode = \"native\"\npin_dir = \"{pin}\"\nneighbour_refresh_ms = 1000\n\n[[port]]\nname = \"p0\"\n\n[[group]]\nname = \"spines\"\nmembers = [\n{members}]\n\n[[route]]\nprefix = \"10.1.0.0/16\"\ngroup = \"spines\"\n\n[[route]]\nprefix = \"fd01::/64\"\ngroup = \"spines\"\n",
            tag = self.tag,
            pin = self.pin_dir().display(),
        )
    }

    /// Writes the config for `hash` to a file under /tmp and returns its path.
    pub fn write_config(&self, hash: &str) -> Result<PathBuf> {
        self.write_config_text(hash, &self.config(hash))
    }

    /// Writes `text` as config `name` under /tmp (removed with the lab).
    pub fn write_config_text(&self, name: &str, text: &str) -> Result<PathBuf> {
        let dir = self.config_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(path)
    }

    fn config_dir(&self) -> PathBuf {
        PathBuf::from(format!("/tmp/rocev2-lab-{}", self.tag))
    }

    /// Every veth's drop counters on the way, where frames can be lost
    /// before or after the switch's XDP program: the sender's snd0 (tx:
    /// the switch's ingress ring was full), the switch's ports and the
    /// uplinks' up0. For a failure message; zeros are left out.
    pub fn link_drops(&self) -> String {
        let mut places = vec![(&self.sender, "snd0".to_string()), (&self.switch, "p0".to_string())];
        places.extend((1..=self.uplinks.len()).map(|i| (&self.switch, format!("u{i}"))));
        places.extend(self.uplinks.iter().map(|u| (u, "up0".to_string())));
        let mut out = Vec::new();
        for (ns, dev) in places {
            let Ok(counts) = crate::sys::netns::device_counts(ns.name(), &dev) else { continue };
            for (dir, dropped) in [("rx", counts.rx.dropped), ("tx", counts.tx.dropped)] {
                if dropped > 0 {
                    out.push(format!("{}/{dev} {dir} dropped {dropped}", ns.name()));
                }
            }
        }
        if out.is_empty() {
            "no veth counted a drop".to_string()
        } else {
            format!("veth drops: {}", out.join(", "))
        }
    }

    /// Runs `ip` (or any command) inside the switch namespace.
    pub fn in_switch(&self, args: &[&str]) -> Result<String> {
        self.switch.exec(args)
    }

    /// Starts `rocev2 --netns <switch> run --config FILE` and waits until
    /// it reports ready.
    pub fn start_dataplane(&self, rocev2: &Path, config: &Path) -> Result<DataplaneProcess> {
        DataplaneProcess::start(rocev2, self.switch.name(), config)
    }

    /// Sends `packets_per_qp` packets on each of `qps` QPs (one WRITE
    /// message per QP, all on one UDP source port) for each address family,
    /// and reports what every uplink received.
    pub fn send_and_capture(&self, qps: u32, packets_per_qp: u32, families: &[Family]) -> Result<LabReport> {
        self.send_bursts_and_capture(vec![lab_frames(qps, packets_per_qp, families)], Duration::ZERO)
    }

    /// [`EcmpLab::send_and_capture`] with capture options.
    pub fn send_and_capture_with(
        &self,
        qps: u32,
        packets_per_qp: u32,
        families: &[Family],
        options: CaptureOptions,
    ) -> Result<LabReport> {
        self.send_bursts_with(vec![lab_frames(qps, packets_per_qp, families)], Duration::ZERO, options)
    }

    /// Sends each burst of frames back to back, pausing `pause` between
    /// bursts, and reports what every uplink received.
    pub fn send_bursts_and_capture(&self, bursts: Vec<Vec<Vec<u8>>>, pause: Duration) -> Result<LabReport> {
        self.send_bursts_with(bursts, pause, CaptureOptions::default())
    }

    fn send_bursts_with(
        &self,
        bursts: Vec<Vec<Vec<u8>>>,
        pause: Duration,
        options: CaptureOptions,
    ) -> Result<LabReport> {
        let capture = self.start_capture_with(options)?;
        let sent = bursts.iter().map(|b| b.len() as u64).sum();
        netns::in_netns(self.sender.name(), move || {
            let socket = PacketSocket::open("snd0")?;
            for (i, burst) in bursts.iter().enumerate() {
                if i > 0 {
                    thread::sleep(pause);
                }
                for (n, frame) in burst.iter().enumerate() {
                    socket.send(frame)?;
                    // Small pauses in long bursts keep the veth queues and
                    // receive buffers from overflowing.
                    if n % 64 == 63 && pause.is_zero() {
                        thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            Ok(())
        })?;
        thread::sleep(Duration::from_millis(500));
        capture.finish(sent)
    }

    /// Starts capturing on every uplink, with an arrival probe on each
    /// (see [`crate::testbed::arrival`]); [`Capture::finish`] stops and reports.
    pub fn start_capture(&self) -> Result<Capture> {
        self.start_capture_with(CaptureOptions::default())
    }

    /// [`EcmpLab::start_capture`] with a capture that may be made to drop.
    pub fn start_capture_with(&self, options: CaptureOptions) -> Result<Capture> {
        let mut probes = Vec::new();
        for ns in self.uplinks.iter().filter(|_| !options.without_arrival_probes) {
            probes.push(ArrivalProbe::attach(ns.name(), "up0")?);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let mut receivers = Vec::new();
        for (i, ns) in self.uplinks.iter().enumerate() {
            let stop = stop.clone();
            let ready = ready_tx.clone();
            receivers.push(spawn_in_netns(ns.name(), move || capture("up0", i + 1, &stop, ready, options))?);
        }
        drop(ready_tx);
        for _ in 0..self.uplinks.len() {
            ready_rx.recv_timeout(Duration::from_secs(10)).context("an uplink receiver did not start")?;
        }
        Ok(Capture { stop, receivers, probes })
    }

    /// Sends `frames` round-robin at `pps` packets per second from the
    /// sender until [`Stream::stop`]; a steady stream for tests that change
    /// the dataplane under traffic.
    /// [`EcmpLab::config`] for RC traffic: the uplinks are ports too and a
    /// `hosts` group routes 10.0.0.1/32 back to the sender, so the
    /// replies cross the dataplane; per-QP telemetry is on (1024 QPs).
    pub fn rc_config(&self, hash: &str) -> String {
        let mut ports = String::from("[[port]]\nname = \"p0\"\n");
        for i in 1..=self.uplinks.len() {
            ports.push_str(&format!("\n[[port]]\nname = \"u{i}\"\n"));
        }
        let base = self
            .config(hash)
            .replace("[[port]]\nname = \"p0\"\n", &ports)
            .replace("neighbour_refresh_ms = 1000\n", "neighbour_refresh_ms = 1000\ntelemetry_qps = 1024\n");
        format!("{base}\n{RC_HOSTS}")
    }

    /// `gen --rc` from the sender to the destination behind the switch:
    /// `qps` QPs from `first_qp`, NIC-style source ports (the rest at
    /// their defaults, for the caller to set).
    pub fn rc_requester_args(&self, qps: u32, first_qp: u32) -> crate::tools::gen::GenArgs {
        let mut args = crate::tools::gen::GenArgs::new(
            "snd0",
            &crate::sys::format_mac(&SWITCH_PORT_MAC),
            "10.0.0.1".parse().expect("an address"),
            DEST_V4.parse().expect("an address"),
        );
        args.rc = true;
        args.qps = qps;
        args.first_qp = first_qp;
        args.sport = crate::tools::gen::SportModel::Nic;
        args
    }

    pub fn start_stream(&self, frames: Vec<Vec<u8>>, pps: u64) -> Result<Stream> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = spawn_in_netns(self.sender.name(), move || {
            let socket = PacketSocket::open("snd0")?;
            let start = Instant::now();
            let mut sent = 0u64;
            // Frames the rate asked for while this thread was not running
            // (a busy machine): given up, not sent in one burst that would
            // overflow the veth rings, which is not what a test measures.
            let mut skipped = 0u64;
            while !flag.load(Ordering::Relaxed) {
                // Catch up to where the rate says we should be, in bursts.
                let mut due = (start.elapsed().as_secs_f64() * pps as f64) as u64 - skipped;
                if due > sent + MAX_STREAM_BURST {
                    skipped += due - sent - MAX_STREAM_BURST;
                    due = sent + MAX_STREAM_BURST;
                }
                while sent < due {
                    socket.send(&frames[(sent % frames.len() as u64) as usize])?;
                    sent += 1;
                }
                thread::sleep(Duration::from_micros(200));
            }
            Ok(sent)
        })?;
        Ok(Stream { stop, handle })
    }
}

/// How the uplinks' captures behave (a test makes one drop on purpose).
#[derive(Clone, Copy, Debug, Default)]
pub struct CaptureOptions {
    /// Receive buffer of each capture socket (default 8 MiB).
    pub receive_buffer: Option<usize>,
    /// How long each receiver waits after opening its socket before it
    /// reads anything: a descheduled capture, made on purpose.
    pub stall: Duration,
    /// No arrival probes (their XDP program would give a veth the NAPI a
    /// test wants it without); `arrived` is then 0.
    pub without_arrival_probes: bool,
}

/// A capture running on every uplink, with an arrival probe on each.
pub struct Capture {
    stop: Arc<AtomicBool>,
    receivers: Vec<thread::JoinHandle<Result<UplinkReport>>>,
    probes: Vec<ArrivalProbe>,
}

impl Capture {
    /// Stops the receivers (after letting in-flight packets arrive) and
    /// reports, with `sent` as the number the sender counted.
    pub fn finish(self, sent: u64) -> Result<LabReport> {
        thread::sleep(Duration::from_millis(300));
        self.stop.store(true, Ordering::Relaxed);
        let mut uplinks = Vec::new();
        for (i, handle) in self.receivers.into_iter().enumerate() {
            let mut report = handle.join().map_err(|_| anyhow::anyhow!("uplink receiver panicked"))??;
            if let Some(probe) = self.probes.get(i) {
                report.arrived = probe.totals()?.roce;
            }
            uplinks.push(report);
        }
        Ok(LabReport { sent, uplinks })
    }
}

/// The most frames a stream sends back to back after a stall.
const MAX_STREAM_BURST: u64 = 64;

/// A steady stream from the sender.
pub struct Stream {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<Result<u64>>,
}

impl Stream {
    /// Stops sending; returns how many frames were sent.
    pub fn stop(self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().map_err(|_| anyhow::anyhow!("stream sender panicked"))?
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

/// One lab frame from the sender to the lab destination of `family`, on
/// the shared UDP source port.
pub fn lab_frame(family: Family, bth: Bth, ecn: u8, payload_len: usize) -> Vec<u8> {
    lab_frame_from_port(family, bth, ecn, payload_len, SHARED_SOURCE_PORT)
}

/// Like [`lab_frame`] from UDP source port `src_port`.
pub fn lab_frame_from_port(family: Family, bth: Bth, ecn: u8, payload_len: usize, src_port: u16) -> Vec<u8> {
    let dst: IpAddr = match family {
        Family::V4 => DEST_V4.parse().unwrap(),
        Family::V6 => DEST_V6.parse().unwrap(),
    };
    lab_frame_to(dst, bth, ecn, payload_len, src_port)
}

/// A frame from the sender to any destination `dst` (the sender's address
/// of `dst`'s family as the source).
pub fn lab_frame_to(dst: IpAddr, bth: Bth, ecn: u8, payload_len: usize, src_port: u16) -> Vec<u8> {
    let src: IpAddr = if dst.is_ipv4() { "10.0.0.1".parse().unwrap() } else { "fd00::1".parse().unwrap() };
    build_roce_frame(&RoceFrameSpec {
        src_mac: SENDER_MAC,
        dst_mac: SWITCH_PORT_MAC,
        vlan: None,
        src_ip: src,
        dst_ip: dst,
        ttl: SENT_TTL,
        dscp: 26,
        ecn,
        src_port,
        bth,
        payload_len,
    })
}

/// The lab's traffic: per family, per QP, one RDMA WRITE message of
/// `packets_per_qp` packets (FIRST, MIDDLE..., LAST) with consecutive PSNs.
pub fn lab_frames(qps: u32, packets_per_qp: u32, families: &[Family]) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    for family in families {
        for p in 0..packets_per_qp {
            for q in 0..qps {
                let op = match (p, packets_per_qp) {
                    (_, 1) => opcode::WRITE_ONLY,
                    (0, _) => opcode::WRITE_FIRST,
                    (p, n) if p == n - 1 => opcode::WRITE_LAST,
                    _ => opcode::WRITE_MIDDLE,
                };
                let bth = Bth { ack_req: p + 1 == packets_per_qp, ..Bth::new(op, 0x100 + q, p) };
                frames.push(lab_frame(*family, bth, 2, 256));
            }
        }
    }
    frames
}

/// What one uplink received.
#[derive(Clone, Debug, Default)]
pub struct UplinkReport {
    pub uplink: usize,
    /// RoCEv2 frames that landed on the uplink, counted by its arrival
    /// probe (XDP) before any socket.
    pub arrived: u64,
    /// Frames the capture socket dropped (its receive buffer full).
    pub observer_dropped: u64,
    /// Frames the capture saw (what the fields below describe).
    pub packets: u64,
    pub ipv4: u64,
    pub ipv6: u64,
    /// Distinct destination QPs seen.
    pub qps: BTreeSet<u32>,
    /// Packets whose TTL/hop limit was not exactly one below what was sent.
    pub bad_ttl: u64,
    pub bad_ipv4_checksum: u64,
    pub bad_icrc: u64,
    /// Packets that arrived with a lower PSN than an earlier one of their QP.
    pub reordered: u64,
    /// Every captured packet, in arrival order.
    pub seen: Vec<Seen>,
}

/// One captured packet's fields that the tests look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    pub dest_qp: u32,
    pub psn: u32,
    pub opcode: u8,
    pub dscp: u8,
    pub ecn: u8,
}

#[derive(Clone, Debug)]
pub struct LabReport {
    pub sent: u64,
    pub uplinks: Vec<UplinkReport>,
}

impl LabReport {
    /// Frames the captures saw.
    pub fn received(&self) -> u64 {
        self.uplinks.iter().map(|u| u.packets).sum()
    }

    /// Frames that landed on the uplinks (arrival probes).
    pub fn arrived(&self) -> u64 {
        self.uplinks.iter().map(|u| u.arrived).sum()
    }

    /// Sent, arrived and captured: what the switch lost and what only the
    /// observer did.
    pub fn loss(&self) -> LossAccount {
        LossAccount {
            sent: self.sent,
            arrived: self.arrived(),
            captured: self.received(),
            observer_dropped: self.uplinks.iter().map(|u| u.observer_dropped).sum(),
        }
    }

    pub fn active_uplinks(&self) -> usize {
        self.uplinks.iter().filter(|u| u.packets > 0).count()
    }

    /// Busiest uplink's load divided by a fair share (1.0 is perfect).
    pub fn max_over_fair(&self) -> f64 {
        let total = self.received();
        if total == 0 {
            return 0.0;
        }
        let max = self.uplinks.iter().map(|u| u.packets).max().unwrap_or(0);
        max as f64 * self.uplinks.len() as f64 / total as f64
    }

    pub fn render(&self) -> String {
        let total = self.received().max(1);
        let mut table = Table::new(&[
            ("UPLINK", Align::Left),
            ("PACKETS", Align::Right),
            ("SHARE", Align::Right),
            ("", Align::Left),
            ("QPs", Align::Right),
            ("TTL-1", Align::Left),
            ("CHECKSUM", Align::Left),
            ("ICRC", Align::Left),
        ]);
        for u in &self.uplinks {
            let share = u.packets as f64 / total as f64;
            let ok = |bad: u64| if bad == 0 { "ok".to_string() } else { format!("{bad} bad") };
            table.row([
                format!("up{}", u.uplink),
                u.packets.to_string(),
                format!("{:.1}%", 100.0 * share),
                share_bar(share),
                u.qps.len().to_string(),
                ok(u.bad_ttl),
                ok(u.bad_ipv4_checksum),
                ok(u.bad_icrc),
            ]);
        }
        let mut out = table.indent(2).render();
        let loss = self.loss();
        let observer = if loss.observer_lost() > 0 || loss.observer_dropped > 0 {
            format!(" (the capture missed {}, its sockets dropped {})", loss.observer_lost(), loss.observer_dropped)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "  sent {} arrived {} captured {}{observer}; {} of {} uplinks used; busiest uplink carries {:.2}x its fair share\n",
            self.sent,
            loss.arrived,
            loss.captured,
            self.active_uplinks(),
            self.uplinks.len(),
            self.max_over_fair()
        ));
        out
    }
}

/// Captures RoCEv2 frames for the lab destinations on `ifname` until `stop`.
fn capture(
    ifname: &str,
    uplink: usize,
    stop: &AtomicBool,
    ready: mpsc::Sender<()>,
    options: CaptureOptions,
) -> Result<UplinkReport> {
    let socket = PacketSocket::open(ifname)?;
    if let Some(bytes) = options.receive_buffer {
        socket.set_receive_buffer(bytes)?;
    }
    ready.send(()).ok();
    thread::sleep(options.stall);
    let dest_v4: IpAddr = DEST_V4.parse().unwrap();
    let dest_v6: IpAddr = DEST_V6.parse().unwrap();
    let mut report = UplinkReport { uplink, ..Default::default() };
    let mut last_psn: BTreeMap<(bool, u32), u32> = BTreeMap::new();
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        let len = match socket.recv(&mut buf, Duration::from_millis(100)) {
            Ok(Some(len)) => len,
            Ok(None) => continue,
            // A test may take this uplink down: it just receives nothing.
            Err(e) if e.kind() == std::io::ErrorKind::NetworkDown || e.raw_os_error() == Some(libc::ENETDOWN) => {
                thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let Ok(p) = parse_roce(&buf[..len]) else { continue };
        if p.dst_ip != dest_v4 && p.dst_ip != dest_v6 {
            continue;
        }
        report.packets += 1;
        let v4 = p.dst_ip.is_ipv4();
        if v4 {
            report.ipv4 += 1;
        } else {
            report.ipv6 += 1;
        }
        report.qps.insert(p.bth.dest_qp);
        report.seen.push(Seen {
            dest_qp: p.bth.dest_qp,
            psn: p.bth.psn,
            opcode: p.bth.opcode,
            dscp: p.dscp,
            ecn: p.ecn,
        });
        if p.ttl_or_hop_limit != SENT_TTL - 1 {
            report.bad_ttl += 1;
        }
        if p.ipv4_checksum_ok == Some(false) {
            report.bad_ipv4_checksum += 1;
        }
        if !p.icrc_ok {
            report.bad_icrc += 1;
        }
        if let Some(prev) = last_psn.insert((v4, p.bth.dest_qp), p.bth.psn) {
            if p.bth.psn < prev {
                report.reordered += 1;
            }
        }
    }
    report.observer_dropped = socket.drops()?;
    Ok(report)
}

impl Drop for EcmpLab {
    fn drop(&mut self) {
        // The namespaces go with their Netns guards; the configs with this.
        let _ = std::fs::remove_dir_all(self.config_dir());
    }
}

/// A running `rocev2 run` child process; stopped with SIGTERM on drop.
pub struct DataplaneProcess {
    child: Option<Child>,
    output: Arc<std::sync::Mutex<Vec<String>>>,
    reader: Option<thread::JoinHandle<()>>,
}

impl DataplaneProcess {
    pub fn start(rocev2: &Path, netns: &str, config: &Path) -> Result<Self> {
        let mut cmd = Command::new(rocev2);
        cmd.args(["--netns", netns, "run", "--config"]).arg(config);
        Self::spawn(cmd)
    }

    /// Starts a command that becomes a `rocev2 run` (`run` itself, or
    /// `rocev2 upgrade`, which execs one) and waits until it reports ready.
    pub fn spawn(mut cmd: Command) -> Result<Self> {
        // stdout and stderr share one pipe, as on a terminal: the log lines
        // (stderr) and `ready` (stdout) keep their order, so everything
        // logged before `ready` is in `output()` once this returns.
        let (pipe, writer) = std::io::pipe().context("cannot make a pipe")?;
        let child = cmd
            .stdout(writer.try_clone().context("cannot clone a pipe")?)
            .stderr(writer)
            .spawn()
            .with_context(|| format!("cannot start {}", cmd.get_program().to_string_lossy()));
        // The command holds the pipe's write end: drop it, so the reader
        // sees the end when the child exits.
        drop(cmd);
        let child = child?;
        let output = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (ready_tx, ready_rx) = mpsc::channel();
        let lines = output.clone();
        let reader = thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                // Kept before it is announced: `ready` itself is in
                // `output()` once `spawn` returns.
                let ready = line == READY_LINE;
                lines.lock().unwrap().push(line);
                if ready {
                    ready_tx.send(()).ok();
                }
            }
        });
        let mut process = Self { child: Some(child), output, reader: Some(reader) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if ready_rx.recv_timeout(Duration::from_millis(100)).is_ok() {
                return Ok(process);
            }
            let exited = process.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                thread::sleep(Duration::from_millis(100));
                let log = process.output();
                bail!("rocev2 run did not become ready ({exited:?}); its output:\n{log}");
            }
        }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the process with SIGKILL, as a crash would: nothing is
    /// detached or unpinned.
    pub fn kill(mut self) -> String {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
        self.output()
    }

    /// Everything the process printed so far.
    pub fn output(&self) -> String {
        self.output.lock().unwrap().join("\n")
    }

    /// Sends SIGTERM, waits for a clean exit and returns the full output.
    pub fn stop(mut self) -> Result<String> {
        self.terminate()
    }

    /// Waits for a process that was told to exit some other way (e.g.
    /// SIGUSR1, handover) and returns its output.
    pub fn stop_after_exit(mut self, timeout: Duration) -> Result<String> {
        let Some(mut child) = self.child.take() else { return Ok(self.output()) };
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                child.kill().ok();
                bail!("rocev2 run did not exit within {timeout:?}:\n{}", self.output());
            }
            thread::sleep(Duration::from_millis(20));
        };
        if let Some(reader) = self.reader.take() {
            reader.join().ok();
        }
        if !status.success() {
            bail!("rocev2 run exited with {status}:\n{}", self.output());
        }
        Ok(self.output())
    }

    fn terminate(&mut self) -> Result<String> {
        let Some(mut child) = self.child.take() else { return Ok(self.output()) };
        let _ = crate::sys::signal_process(child.id(), nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                child.kill().ok();
                bail!("rocev2 run did not exit within 10 s of SIGTERM:\n{}", self.output());
            }
            thread::sleep(Duration::from_millis(50));
        };
        if let Some(reader) = self.reader.take() {
            reader.join().ok();
        }
        if !status.success() {
            bail!("rocev2 run exited with {status}:\n{}", self.output());
        }
        Ok(self.output())
    }
}

impl Drop for DataplaneProcess {
    fn drop(&mut self) {
        let _ = self.terminate();
    }
}

/// `rocev2 demo`: the same 64 QPs on one UDP source port, first with
/// five-tuple hashing, then with QP hashing.
pub fn demo(qps: u32, packets_per_qp: u32, uplinks: u32) -> Result<()> {
    let rocev2 = std::env::current_exe().context("cannot find the rocev2 binary")?;
    println!("Building a lab: sender -> switch (rocev2 XDP) -> {uplinks} uplinks, in network namespaces...");
    let lab = EcmpLab::create(uplinks as usize)?;
    println!(
        "Traffic: {qps} QPs from 10.0.0.1 to {DEST_V4} and fd00::1 to {DEST_V6}, all on UDP source port {SHARED_SOURCE_PORT:#x}, {packets_per_qp} packets per QP and family.\n"
    );
    let mut results = Vec::new();
    for hash in ["five-tuple", "qp"] {
        let config = lab.write_config(hash)?;
        let dataplane = lab.start_dataplane(&rocev2, &config)?;
        let report = lab.send_and_capture(qps, packets_per_qp, &[Family::V4, Family::V6])?;
        dataplane.stop()?;
        // The config is a temporary file that goes with the lab: not shown.
        println!("hash = \"{hash}\"");
        print!("{}", report.render());
        println!();
        results.push((hash, report));
    }
    for (hash, report) in &results {
        println!(
            "{hash:>10}: {} of {} uplinks carried traffic, busiest at {:.2}x fair share",
            report.active_uplinks(),
            report.uplinks.len(),
            report.max_over_fair()
        );
    }
    println!("\nQP hashing (Meta's E-ECMP) spreads the QPs that five-tuple hashing piles onto one uplink.");
    println!(
        "The demo's lab is gone; `rocev2 lab up` builds one that stays, with its config (the book's tutorial: docs/src/tutorial-entropy.md; in a source tree, `export PATH=$PWD/target/release:$PATH` first)."
    );
    Ok(())
}
