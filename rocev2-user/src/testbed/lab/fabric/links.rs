//! Rated links: `lab up --racks N --link-rate 20mbit --leaf-buffer 64k
//! --spine-buffer 1m` gives every fabric link a rate and a real queue.
//!
//! The switches forward in XDP, and a frame XDP redirects into a veth skips
//! that veth's qdisc: without more, every lab link is as fast as the CPU and
//! nothing ever queues. So each link of a rated fabric passes through the
//! lab's wire namespace (`<name>-wire`), where a Linux bridge joins its two
//! halves and the kernel's stack, qdiscs included, carries every frame:
//!
//! ```text
//!  [l1] s1p1 ──veth── s1-l1p1 ═[bridge]═ l1-s1p1 ──veth── l1p1 [s1]
//!                     └ queue of s1 -> l1   └ queue of l1 -> s1
//! ```
//!
//! A wire device is named after the direction it transmits (`l1-s1p1`:
//! what leaf l1 sends out of its port s1p1, the link `l1/s1p1` of `lab
//! stats`), and that direction's queue lives on it: an HTB shaper at the
//! link rate with two classes, control (DSCP 48: ACK, CNP, CTS) served
//! first from a small packet FIFO, and data from a byte FIFO as deep as the
//! sending switch's buffer (`--leaf-buffer` on leaves, `--spine-buffer` on
//! spines and aggregation switches). The queueing delay grows with the
//! FIFO's occupancy; a frame that finds it full is dropped (tail drop, a
//! lossy fabric: there is no PFC pause). Hosts send through their NIC, the
//! host's eth0, shaped the same way with a deep queue: a sender whose socket
//! buffer is full waits, as a NIC never drops what its host hands it.
//!
//! ECN marks come from the switches' own virtual queues: every switch port
//! on a rated link gets an `[[egress]]` draining at the link rate, with the
//! tier's `[[ecn_profile]]` (by default marking from a quarter of the
//! buffer, every ECT packet above three quarters). The virtual queue sees
//! exactly the frames the real one gets, at the same rate, so its depth
//! follows the real queue's (it also counts what the real one dropped).
//!
//! What the box can carry: every frame crosses the kernel's stack once per
//! link, so a lab can ask for more than the CPU forwards. `lab up` measures
//! how many frames per second one path through the fabric carries right now
//! ([`measure_path`]), refuses rates that need four times more and warns
//! above half of it.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde::{Deserialize, Serialize};

use super::{host_ns, SwitchRecord};
use crate::{
    control::config::{parse_rate_arg, parse_size_arg},
    sys::netns::{ip, spawn_in_netns, VethPlan},
    tools::fabric::{Fabric, LinkId, Switch, Tier},
};

/// DSCP of the control class (ACK, CNP, CTS), as RoCE NICs are configured.
pub const CONTROL_DSCP: u8 = 48;
/// DSCP of RoCE data.
pub const DATA_DSCP: u8 = 26;
/// Frames the control FIFO of a queue holds.
const CONTROL_QUEUE_PACKETS: u32 = 256;
/// The host NIC's queue: deep, the socket buffer limits what waits in it.
const NIC_BUFFER: u64 = 4 << 20;
/// The smallest buffer that holds a few full frames.
const MIN_BUFFER: u64 = 4 * 1536;
const MIN_RATE_BPS: u64 = 1_000_000;
const MAX_RATE_BPS: u64 = 10_000_000_000;
/// Frame bytes of a full-size lab data packet (1024 payload bytes + headers).
pub const DATA_FRAME_BYTES: u64 = 1082;
/// `lab up` refuses a rate that needs this many times what one path carried.
pub const REFUSE_ABOVE: f64 = 4.0;
/// How long `lab up` sends to measure what the box carries.
const MEASURE_FOR: Duration = Duration::from_millis(600);

/// The options of `lab up` that rate a fabric's links.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LinkArgs {
    /// Every fabric link through the lab's wire namespace (a bridge per
    /// link, unshaped; `--link-rate` implies it): `rocev2 lab link L down`
    /// then fails a link as a cable cut does, both ends losing carrier
    /// while staying administratively up.
    #[arg(long, requires = "racks")]
    pub wires: bool,
    /// Give every fabric link (host-leaf, leaf-spine, spine-aggregation)
    /// this rate and a real queue (tc spelling: 20mbit, 1gbit): frames
    /// queue, wait, get ECN-marked and, when a buffer is full, dropped.
    #[arg(long, value_name = "RATE", value_parser = parse_rate_arg, requires = "racks")]
    pub link_rate: Option<u64>,
    /// Buffer of a leaf's egress queue on each rated link (64k, 1m; default 64k).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, requires = "link_rate")]
    pub leaf_buffer: Option<u64>,
    /// Buffer of a spine's (and aggregation switch's) egress queue: deep, as in the paper (default 1m).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, requires = "link_rate")]
    pub spine_buffer: Option<u64>,
    /// Queue depth where ECN marking starts (default: a quarter of each switch's buffer).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, requires = "link_rate")]
    pub ecn_kmin: Option<u64>,
    /// Queue depth above which every ECT packet is marked (default: three quarters of each switch's buffer).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, requires = "link_rate")]
    pub ecn_kmax: Option<u64>,
    /// Marking probability reached at --ecn-kmax (0-1; default 0.2).
    #[arg(long, value_name = "P", requires = "link_rate")]
    pub ecn_pmax: Option<f64>,
}

/// Default buffers: shallow leaves, deep spines.
pub const DEFAULT_LEAF_BUFFER: u64 = 64 << 10;
pub const DEFAULT_SPINE_BUFFER: u64 = 1 << 20;
const DEFAULT_PMAX: f64 = 0.2;

/// ECN marking of one tier's queues.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Marking {
    pub kmin_bytes: u64,
    pub kmax_bytes: u64,
    pub pmax: f64,
}

/// The rate and buffers of a rated fabric.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkSettings {
    /// Every link's rate, bits per second (frame bytes: Ethernet header to
    /// the ICRC, no preamble or gap).
    pub rate_bps: u64,
    pub leaf_buffer: u64,
    pub spine_buffer: u64,
    pub leaf_marking: Marking,
    pub spine_marking: Marking,
}

impl LinkSettings {
    /// The settings `args` ask for, or `None` for a lab without rated links.
    pub fn from_args(args: &LinkArgs) -> Result<Option<Self>> {
        let Some(rate_bps) = args.link_rate else { return Ok(None) };
        if !(MIN_RATE_BPS..=MAX_RATE_BPS).contains(&rate_bps) {
            bail!(
                "--link-rate {} is outside 1mbit..10gbit (frames cross the kernel's stack once per link: see `lab up --help`)",
                rate_text(rate_bps)
            );
        }
        let leaf_buffer = args.leaf_buffer.unwrap_or(DEFAULT_LEAF_BUFFER);
        let spine_buffer = args.spine_buffer.unwrap_or(DEFAULT_SPINE_BUFFER);
        for (flag, b) in [("--leaf-buffer", leaf_buffer), ("--spine-buffer", spine_buffer)] {
            if b < MIN_BUFFER {
                bail!("{flag} {b} bytes holds fewer than 4 full frames; use at least {MIN_BUFFER} (6k)");
            }
        }
        let pmax = args.ecn_pmax.unwrap_or(DEFAULT_PMAX);
        if !(0.0..=1.0).contains(&pmax) {
            bail!("--ecn-pmax {pmax} is not a probability (0-1)");
        }
        let marking = |buffer: u64| -> Result<Marking> {
            let kmin = args.ecn_kmin.unwrap_or(buffer / 4);
            let kmax = args.ecn_kmax.unwrap_or(buffer * 3 / 4);
            if kmin > kmax {
                bail!("--ecn-kmin {kmin} is above --ecn-kmax {kmax}");
            }
            Ok(Marking { kmin_bytes: kmin, kmax_bytes: kmax, pmax })
        };
        Ok(Some(Self {
            rate_bps,
            leaf_buffer,
            spine_buffer,
            leaf_marking: marking(leaf_buffer)?,
            spine_marking: marking(spine_buffer)?,
        }))
    }

    /// The buffer of the queue `switch` sends into.
    pub fn buffer_of(&self, switch: Switch) -> u64 {
        match switch {
            Switch::Leaf(_) => self.leaf_buffer,
            Switch::Spine(_) | Switch::Agg(_) => self.spine_buffer,
        }
    }

    pub fn marking_of(&self, switch: Switch) -> Marking {
        match switch {
            Switch::Leaf(_) => self.leaf_marking,
            Switch::Spine(_) | Switch::Agg(_) => self.spine_marking,
        }
    }

    /// One line for `lab up` and `lab status`.
    pub fn describe(&self) -> String {
        format!(
            "links rated {} (leaf buffer {}, spine buffer {}; ECN from {} / {}, tail drop when full)",
            rate_text(self.rate_bps),
            size_text(self.leaf_buffer),
            size_text(self.spine_buffer),
            size_text(self.leaf_marking.kmin_bytes),
            size_text(self.spine_marking.kmin_bytes),
        )
    }

    /// Full-size data frames per second one link carries.
    pub fn frames_per_sec(&self) -> f64 {
        self.rate_bps as f64 / (8.0 * DATA_FRAME_BYTES as f64)
    }
}

pub use crate::render::{rate_text, size_text};

/// One direction's queue, as built.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueRecord {
    /// The direction: `l1/s1p1` (a switch and its port) or `r1h1/eth0` (a host's NIC).
    pub link: String,
    /// The switch that sends on it; `None` for a host's NIC.
    pub switch: Option<Switch>,
    /// The sending switch's port (its `[[egress]]`), or eth0.
    pub port: String,
    /// Where the qdisc is.
    pub netns: String,
    pub dev: String,
    pub buffer: u64,
}

/// What `lab up` recorded about a rated fabric.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RatedLinks {
    pub settings: LinkSettings,
    pub wire_netns: String,
    pub queues: Vec<QueueRecord>,
    /// Frames per second one path carried when `lab up` measured it.
    pub measured_path_fps: Option<f64>,
    /// What each switch port had marked when the queues were set up: the
    /// unshaped probe's marks, which `lab stats` leaves out while the
    /// same `rocev2 run` is up.
    #[serde(default)]
    pub marks_at_setup: Vec<MarksAtSetup>,
}

/// A switch port's ECN marks when `lab up` set the queues up, and the
/// `rocev2 run` that counted them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MarksAtSetup {
    pub link: String,
    pub pid: u32,
    pub marked: u64,
}

/// Bridges of the wire namespace and the queues to set up, planned with
/// the fabric.
#[derive(Clone, Debug, Default)]
pub struct WirePlan {
    pub netns: String,
    /// (bridge, its two devices).
    pub bridges: Vec<(String, [String; 2])>,
    pub queues: Vec<QueueRecord>,
}

/// One end of a fabric link for [`WirePlan::add`]: who sends from it.
pub enum Sender {
    Switch(Switch),
    /// A host (rack, index): its NIC is eth0.
    Host(u32, u32),
}

impl WirePlan {
    pub fn new(lab: &str) -> Self {
        Self { netns: wire_ns(lab), ..Default::default() }
    }

    /// Routes `link` through the wire namespace: returns the two veth pairs
    /// to build instead of it. `a` sends from `link.a_*`, `b` from `link.b_*`.
    /// Without `settings` (unrated wires) no queue is planned.
    pub fn add(&mut self, link: VethPlan, a: Sender, b: Sender, settings: Option<&LinkSettings>) -> [VethPlan; 2] {
        let n = self.bridges.len() as u32 + 1;
        // Each wire device transmits toward its own end's neighbour: the one
        // facing `a` carries what b sends, and is named after that direction.
        let toward_a = self.direction(&b, &link.b_ns, &link.b_if, settings);
        let toward_b = self.direction(&a, &link.a_ns, &link.a_if, settings);
        let mac = |side: u8| [0x02, 0x57, 0x49, (n >> 8) as u8, n as u8, side];
        let first = VethPlan {
            a_ns: link.a_ns.clone(),
            a_if: link.a_if.clone(),
            a_mac: link.a_mac,
            a_addrs: link.a_addrs.clone(),
            b_ns: self.netns.clone(),
            b_if: toward_a.clone(),
            b_mac: mac(1),
            b_addrs: vec![],
            gro_b: true,
        };
        let second = VethPlan {
            a_ns: self.netns.clone(),
            a_if: toward_b.clone(),
            a_mac: mac(2),
            a_addrs: vec![],
            b_ns: link.b_ns,
            b_if: link.b_if,
            b_mac: link.b_mac,
            b_addrs: link.b_addrs,
            gro_b: link.gro_b,
        };
        self.bridges.push((format!("br{n}"), [toward_a, toward_b]));
        [first, second]
    }

    /// The wire device carrying what `sender` sends out of `port` (in
    /// `ns`), and the queue that shapes it.
    fn direction(&mut self, sender: &Sender, ns: &str, port: &str, settings: Option<&LinkSettings>) -> String {
        let Some(settings) = settings else {
            return match sender {
                Sender::Switch(s) => format!("{s}-{port}"),
                Sender::Host(r, i) => format!("r{r}h{i}"),
            };
        };
        match sender {
            Sender::Switch(s) => {
                let dev = format!("{s}-{port}");
                self.queues.push(QueueRecord {
                    link: format!("{s}/{port}"),
                    switch: Some(*s),
                    port: port.to_owned(),
                    netns: self.netns.clone(),
                    dev: dev.clone(),
                    buffer: settings.buffer_of(*s),
                });
                dev
            }
            Sender::Host(r, i) => {
                // The host's NIC shapes what it sends; its wire device passes it on.
                self.queues.push(QueueRecord {
                    link: format!("r{r}h{i}/{port}"),
                    switch: None,
                    port: port.to_owned(),
                    netns: ns.to_owned(),
                    dev: port.to_owned(),
                    buffer: NIC_BUFFER,
                });
                format!("r{r}h{i}")
            }
        }
    }
}

pub fn wire_ns(lab: &str) -> String {
    format!("{lab}-wire")
}

/// Sysctls of the wire namespace: no forwarding and no IPv6 (a bridge
/// port with IPv6 would send router solicitations and MLD reports into
/// the links).
pub fn wire_sysctls() -> Vec<String> {
    [
        "net.ipv4.ip_forward=0",
        "net.ipv6.conf.all.disable_ipv6=1",
        "net.ipv6.conf.default.disable_ipv6=1",
        "net.ipv6.conf.all.forwarding=0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Joins each link's two wire devices with a bridge. Every wire device
/// receives frames redirected by XDP into its peer, so it needs NAPI (GRO).
///
/// Every wire device also sends with TSO off, so that what it sends
/// always goes into its peer's NAPI ring: a veth with TSO on hands a
/// forwarded frame to a peer without XDP (a host's eth0) through
/// `netif_rx`, into the backlog of whichever CPU is dequeuing its qdisc.
/// A shaped queue is dequeued on both CPUs in turn (the sender's, the
/// HTB timer's), and when one CPU's backlog waits (ksoftirqd under load)
/// the next frame, queued on the other, overtakes it: one QP's PSNs
/// arrive swapped with nothing dropped. The kernel already turns TSO off
/// on a veth whose peer runs XDP (every switch port), which is why only
/// the last hop into a host swapped frames.
pub fn join_wires(plan: &WirePlan) -> Result<()> {
    let ns = plan.netns.as_str();
    for (bridge, [x, y]) in &plan.bridges {
        ip(&["-n", ns, "link", "add", bridge, "type", "bridge", "stp_state", "0", "mcast_snooping", "0"])
            .with_context(|| format!("creating bridge {bridge} in {ns}"))?;
        for dev in [x, y] {
            ip(&["-n", ns, "link", "set", dev, "master", bridge])?;
            ip(&["netns", "exec", ns, "ethtool", "-K", dev, "gro", "on", "tso", "off"])
                .with_context(|| format!("turning GRO on and TSO off for {ns}/{dev}"))?;
        }
        ip(&["-n", ns, "link", "set", bridge, "up"])?;
    }
    Ok(())
}

/// The `tc` commands (after `tc -n NS`) of one direction's queue.
pub fn shaper_commands(dev: &str, rate_bps: u64, buffer: u64) -> Vec<Vec<String>> {
    let rate = format!("{rate_bps}bit");
    // HTB serves a class under its own rate without asking the parent, so
    // the two classes' rates add up to the link's; each may borrow up to it.
    let control = format!("{}bit", (rate_bps / 10).max(8_000));
    let data = format!("{}bit", rate_bps - (rate_bps / 10).max(8_000).min(rate_bps / 2));
    // Bursts of two full frames keep the shaper close to the rate at every
    // instant; a quantum of one frame keeps HTB from warning at low rates.
    let (burst, quantum) = ("3200b", "1600");
    let dscp = format!("{:#x}", CONTROL_DSCP << 2);
    let args: Vec<String> = vec![
        format!("qdisc replace dev {dev} root handle 1: htb default 20"),
        format!("class add dev {dev} parent 1: classid 1:1 htb rate {rate} ceil {rate} burst {burst} cburst {burst} quantum {quantum}"),
        format!("class add dev {dev} parent 1:1 classid 1:10 htb rate {control} ceil {rate} burst {burst} cburst {burst} quantum {quantum} prio 0"),
        format!("class add dev {dev} parent 1:1 classid 1:20 htb rate {data} ceil {rate} burst {burst} cburst {burst} quantum {quantum} prio 1"),
        format!("qdisc add dev {dev} parent 1:10 handle 10: pfifo limit {CONTROL_QUEUE_PACKETS}"),
        format!("qdisc add dev {dev} parent 1:20 handle 20: bfifo limit {buffer}"),
        format!("filter add dev {dev} parent 1: protocol ip prio 1 u32 match ip dsfield {dscp} 0xfc flowid 1:10"),
        format!("filter add dev {dev} parent 1: protocol ipv6 prio 2 u32 match ip6 priority {dscp} 0xfc flowid 1:10"),
    ];
    args.into_iter().map(|a| a.split(' ').map(str::to_owned).collect()).collect()
}

/// Sets up every queue of `queues` at `rate_bps`.
///
/// A host's NIC (eth0) also sends with TSO off, for the reason
/// [`join_wires`] gives for the wire devices: its peer in the wire
/// namespace runs no XDP, so with TSO on every frame a host sent reached
/// that peer through `netif_rx`, into the backlog of whichever CPU was
/// dequeuing the NIC's HTB queue (the sender's or the HTB timer's), and a
/// QP's frames could swap on the first hop. Seen as `ethtool -S l1-h2` in
/// the wire namespace counting 0 `rx_queue_0_xdp_packets` (frames through
/// its NAPI ring) for 1971 received after an AllReduce.
pub fn install_queues(queues: &[QueueRecord], rate_bps: u64) -> Result<()> {
    for q in queues {
        if q.switch.is_none() {
            ip(&["netns", "exec", &q.netns, "ethtool", "-K", &q.dev, "tso", "off"])
                .with_context(|| format!("turning TSO off for {}/{}", q.netns, q.dev))?;
        }
        for args in shaper_commands(&q.dev, rate_bps, q.buffer) {
            let mut full = vec!["-n".to_owned(), q.netns.clone()];
            full.extend(args);
            tc(&full).with_context(|| format!("setting up the queue of {}", q.link))?;
        }
    }
    Ok(())
}

fn tc(args: &[String]) -> Result<String> {
    let out = std::process::Command::new("tc").args(args).output().context("cannot run tc (iproute2)")?;
    if !out.status.success() {
        bail!("`tc {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `[[ecn_profile]]` and `[[egress]]` sections, and the control classes,
/// of a switch on rated links.
pub fn switch_config(settings: &LinkSettings, switch: Switch, ports: &[String]) -> String {
    let m = settings.marking_of(switch);
    let mut t = format!(
        "\n# Rated links ({}): every port's virtual queue drains at the link rate and marks ECN.\n\
         [[ecn_profile]]\nname = \"lab\"\nkmin = {}\nkmax = {}\npmax = {}\n",
        rate_text(settings.rate_bps),
        m.kmin_bytes,
        m.kmax_bytes,
        m.pmax
    );
    for p in ports {
        let _ = write!(t, "\n[[egress]]\ndev = \"{p}\"\nrate = {}\necn_profile = \"lab\"\n", settings.rate_bps / 8);
    }
    // ACK, CNP and the CTS/RTS grants (a WRITE_ONLY with immediate and no
    // data) travel in the control class: never marked.
    t.push_str(
        "\n[[class]]\nname = \"control\"\nopcodes = [0x11, 0x81]\necn_exempt = true\n\
         \n[[class]]\nname = \"cts\"\nopcodes = [0x0B]\nmax_payload = 64\necn_exempt = true\n",
    );
    t
}

/// One direction's queue as `lab stats` shows it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct QueueStats {
    pub link: String,
    /// Frames and bytes the link sent.
    pub packets: u64,
    pub bytes: u64,
    /// Data frames dropped because the buffer was full.
    pub drops: u64,
    /// Bytes waiting now.
    pub backlog_bytes: u64,
    pub buffer: u64,
    /// The switch's virtual queue: packets it marked CE, its deepest point.
    pub ecn_marked: u64,
    pub virtual_high_water_bytes: u64,
}

/// Every queue's counters now.
pub fn queue_stats(rated: &RatedLinks, switches: &[SwitchRecord]) -> Result<Vec<QueueStats>> {
    let mut qdiscs: BTreeMap<(String, String), Vec<serde_json::Value>> = BTreeMap::new();
    let namespaces: std::collections::BTreeSet<&str> = rated.queues.iter().map(|q| q.netns.as_str()).collect();
    for ns in namespaces {
        let text = tc(&["-n".into(), ns.into(), "-s".into(), "-j".into(), "qdisc".into(), "show".into()])?;
        let list: Vec<serde_json::Value> =
            serde_json::from_str(&text).with_context(|| format!("tc printed something other than JSON in {ns}"))?;
        for q in list {
            let dev = q["dev"].as_str().unwrap_or_default().to_owned();
            qdiscs.entry((ns.to_owned(), dev)).or_default().push(q);
        }
    }
    let egress = switch_egress(switches)?;
    let pid_of = |switch: Switch| switches.iter().find(|s| s.switch == switch).and_then(|s| s.pid);
    let get = |q: &serde_json::Value, k: &str| q[k].as_u64().unwrap_or(0);
    let mut out = Vec::new();
    for q in &rated.queues {
        let list = qdiscs.get(&(q.netns.clone(), q.dev.clone())).map(Vec::as_slice).unwrap_or(&[]);
        let root = list.iter().find(|x| x["parent"].as_str().is_none() || x["root"].as_bool() == Some(true));
        let (marked, high) = q.switch.and_then(|s| egress.get(&(s, q.port.clone())).copied()).unwrap_or_default();
        let at_setup = rated.marks_at_setup.iter().find(|m| m.link == q.link);
        let marked = marks_since_setup(marked, at_setup, q.switch.and_then(pid_of));
        out.push(QueueStats {
            link: q.link.clone(),
            packets: root.map_or(0, |r| get(r, "packets")),
            bytes: root.map_or(0, |r| get(r, "bytes")),
            // The root HTB counts its classes' drops.
            drops: root.map_or(0, |r| get(r, "drops")),
            backlog_bytes: root.map_or(0, |r| get(r, "backlog")),
            buffer: q.buffer,
            ecn_marked: marked,
            virtual_high_water_bytes: high,
        });
    }
    Ok(out)
}

/// A port's marks less those of `lab up`'s unshaped probe, while the run
/// that counted the probe (`at_setup`) is the one up (`pid`); a restarted
/// run counts from zero.
fn marks_since_setup(marked: u64, at_setup: Option<&MarksAtSetup>, pid: Option<u32>) -> u64 {
    match at_setup {
        Some(m) if pid == Some(m.pid) => marked.saturating_sub(m.marked),
        _ => marked,
    }
}

/// Each running switch's egress ports: (ECN marks, virtual queue high-water).
fn switch_egress(switches: &[SwitchRecord]) -> Result<BTreeMap<(Switch, String), (u64, u64)>> {
    let mut egress = BTreeMap::new();
    for s in switches {
        let Ok(state) = crate::control::state::RunState::read(&s.pin_dir) else { continue };
        let maps = crate::control::dataplane::Maps::open_pinned(&s.pin_dir)?;
        for e in crate::control::stats::Snapshot::collect(&maps, &state)?.egress {
            let marked = e.counters.get("ecn_marked").copied().unwrap_or(0);
            egress.insert((s.switch, e.name), (marked, e.queue_high_water_bytes));
        }
    }
    Ok(egress)
}

/// Every switch port's marks now, with the run that counted them: taken
/// when the queues are set up, after the unshaped probe.
pub fn marks_at_setup(queues: &[QueueRecord], switches: &[SwitchRecord]) -> Result<Vec<MarksAtSetup>> {
    let egress = switch_egress(switches)?;
    Ok(queues
        .iter()
        .filter_map(|q| {
            let switch = q.switch?;
            let pid = switches.iter().find(|s| s.switch == switch)?.pid?;
            let (marked, _) = egress.get(&(switch, q.port.clone()))?;
            Some(MarksAtSetup { link: q.link.clone(), pid, marked: *marked })
        })
        .collect())
}

/// Fabric links (switch-sent directions) of `queues` as the simulator names them.
pub fn link_id(q: &QueueRecord) -> Option<LinkId> {
    let s = q.switch?;
    Some(LinkId { tier: Fabric::tier_of(s, &q.port), switch: s, port: q.port.clone() })
}

/// Is this queue a host's NIC?
pub fn is_nic(q: &QueueRecord) -> bool {
    q.switch.is_none()
}

/// The order `lab stats` lists queues in: hosts' NICs, then by tier.
pub fn tier_rank(q: &QueueRecord) -> usize {
    match link_id(q) {
        None => 0,
        Some(l) => 1 + Tier::ALL.iter().position(|t| *t == l.tier).unwrap_or(0),
    }
}

/// The columns come from two places that start counting at different
/// times: the wire namespace's qdiscs (since `lab up`) and each switch's
/// dataplane counters (since its `rocev2 run` started, less what the run
/// counted before the queues were set up; `lab mode` and `lab te` restart
/// the runs). Said under the table so a zero is not misread.
const COUNTED_SINCE: &str = "PACKETS, BYTES, DROPPED: since `lab up`; VQ HIGH-WATER, ECN MARKED: since `lab up`, or \
                             since `lab mode` or `lab te` last restarted the switch's `rocev2 run`";

/// `lab stats`' table of every link's queue.
pub fn render_queues(rated: &RatedLinks, stats: &[QueueStats]) -> String {
    use crate::render::{Align::*, Table};
    let mut order: Vec<(usize, &QueueRecord, &QueueStats)> =
        rated.queues.iter().zip(stats).map(|(q, s)| (tier_rank(q), q, s)).collect();
    order.sort_by(|a, b| (a.0, &a.1.link).cmp(&(b.0, &b.1.link)));
    let mut table = Table::new(&[
        ("LINK", Left),
        ("TIER", Left),
        ("PACKETS", Right),
        ("BYTES", Right),
        ("QUEUE NOW", Right),
        ("BUFFER", Right),
        ("VQ HIGH-WATER", Right),
        ("ECN MARKED", Right),
        ("DROPPED", Right),
    ]);
    for (_, q, s) in order {
        let tier = link_id(q).map_or("host->leaf", |l| l.tier.name());
        let switch_only = |v: u64| if is_nic(q) { "-".to_string() } else { v.to_string() };
        table.row([
            q.link.clone(),
            tier.to_owned(),
            s.packets.to_string(),
            s.bytes.to_string(),
            s.backlog_bytes.to_string(),
            if is_nic(q) { "NIC".into() } else { size_text(q.buffer) },
            switch_only(s.virtual_high_water_bytes),
            switch_only(s.ecn_marked),
            s.drops.to_string(),
        ]);
    }
    let (drops, marks): (u64, u64) = stats.iter().fold((0, 0), |(d, m), s| (d + s.drops, m + s.ecn_marked));
    format!(
        "Queues: every link {} ({}); {marks} packets ECN-marked, {drops} dropped in all\n{}{}\n",
        rate_text(rated.settings.rate_bps),
        rated.wire_netns,
        table.render(),
        COUNTED_SINCE
    )
}

/// What one path of the fabric carried, and whether the rated links fit it.
#[derive(Clone, Debug)]
pub struct Capacity {
    pub path_fps: f64,
    /// Frames per second the fabric needs with every host sending at the link rate.
    pub needed_fps: f64,
}

impl Capacity {
    /// The verdict. A measurement on a machine others use varies
    /// several-fold with their load (a quarter of the quiet figure was
    /// seen while another lab ran), so a rate is refused only when it needs
    /// more than [`REFUSE_ABOVE`] times what was measured, which no quieter
    /// moment would carry; above half of it, a warning.
    pub fn check(&self, settings: &LinkSettings, hosts: u32) -> Result<Option<String>> {
        let fit = self.path_fps / hosts as f64 * 8.0 * DATA_FRAME_BYTES as f64;
        let safe = rate_text(((fit / 2.0) as u64 / 1_000_000 * 1_000_000).max(MIN_RATE_BPS));
        let what = format!(
            "{hosts} hosts sending at {} need {:.0} frames/s through the fabric; one path carried {:.0} frames/s when measured just now",
            rate_text(settings.rate_bps),
            self.needed_fps,
            self.path_fps
        );
        if self.needed_fps > self.path_fps * REFUSE_ABOVE {
            bail!(
                "{what}: this box cannot carry that rate, so the links would not be what limits the traffic; use --link-rate {safe} or lower"
            );
        }
        Ok((self.needed_fps > self.path_fps / 2.0).then(|| {
            format!(
                "warning: {what}: above half of it, the CPU may be what limits the traffic (--link-rate {safe} or lower leaves room)"
            )
        }))
    }
}

/// Sends XDP live frames (the kernel transmits them, so the sender's own
/// speed never limits) from the first host to a host of the last rack
/// (every tier on the way) for `MEASURE_FOR` (0.6 s) and counts, by the
/// destination's interface counters, what arrived per second: what the
/// box's stack and dataplanes forward along one path right now.
pub fn measure_path(lab: &str, fabric: &Fabric) -> Result<f64> {
    let src = (1, 1);
    let dst = if fabric.racks > 1 { (fabric.racks, 1) } else { (1, fabric.hosts.min(2)) };
    if src == dst {
        bail!("a fabric of one host has no path to measure");
    }
    let v6 = !fabric.v4;
    let c = crate::tools::fabric::Connection { src, dst, v6, first_qp: 0x100 };
    let spec = crate::tools::fabric::TrafficSpec {
        pattern: crate::tools::fabric::Pattern::Ring,
        qps: 8,
        messages: 1,
        sport: crate::tools::gen::SportModel::Nic,
    };
    let mut args = fabric.gen_args(&c, &spec);
    args.count = None;
    args.duration = Some(MEASURE_FOR.as_secs_f64());
    args.mode = crate::tools::gen::GenMode::LiveFrames;
    let dst_ns = host_ns(lab, dst.0, dst.1);
    // The host's RoCE endpoint, so the kernel answers nothing.
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let endpoint = spawn_in_netns(&dst_ns, move || {
        let _udp = std::net::UdpSocket::bind("[::]:4791").context("binding UDP port 4791")?;
        let _ = ready_tx.send(());
        let _ = stop_rx.recv_timeout(Duration::from_secs(30));
        Ok(())
    })?;
    ready_rx.recv_timeout(Duration::from_secs(10)).context("the measuring host did not start")?;
    let before = rx_packets(&dst_ns)?;
    let started = Instant::now();
    let sent = spawn_in_netns(&host_ns(lab, src.0, src.1), move || crate::tools::gen::generate(&args))?
        .join()
        .map_err(|_| anyhow::anyhow!("the measuring generator panicked"))??;
    // Let the last frames through the queues.
    std::thread::sleep(Duration::from_millis(100));
    let arrived = rx_packets(&dst_ns)?.saturating_sub(before);
    let _ = stop_tx.send(());
    let _ = endpoint.join();
    if arrived == 0 {
        bail!(
            "measuring the fabric: {} frames sent from r1h1 in {:.1} s, none arrived at r{}h{}",
            sent.packets,
            started.elapsed().as_secs_f64(),
            dst.0,
            dst.1
        );
    }
    Ok(arrived as f64 / sent.elapsed_secs.max(1e-3))
}

/// Frames eth0 of host namespace `ns` has received.
fn rx_packets(ns: &str) -> Result<u64> {
    Ok(crate::sys::netns::device_counts(ns, "eth0")?.rx.packets)
}

/// Empties every switch's virtual queues (after the measurement, whose
/// unshaped burst filled them far beyond what the links will ever carry).
pub fn reset_virtual_queues(switches: &[SwitchRecord]) -> Result<()> {
    for s in switches {
        let state = crate::control::state::RunState::read(&s.pin_dir)
            .with_context(|| format!("the dataplane of {} is not running", s.switch))?;
        let mut maps = crate::control::dataplane::Maps::open_pinned(&s.pin_dir)?;
        for e in &state.egress {
            maps.empty_virtual_queue(e.slot)?;
        }
    }
    Ok(())
}

/// Frames per second a fabric of `hosts` hosts needs at `settings`' rate.
pub fn needed_fps(settings: &LinkSettings, hosts: u32) -> f64 {
    settings.frames_per_sec() * hosts as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probes_marks_are_left_out_while_its_run_is_up() {
        let probe = MarksAtSetup { link: "l2/h1".into(), pid: 41, marked: 45 };
        assert_eq!(marks_since_setup(52, Some(&probe), Some(41)), 7);
        // `lab mode` restarted the run: its counters began after the probe.
        assert_eq!(marks_since_setup(3, Some(&probe), Some(77)), 3);
        assert_eq!(marks_since_setup(52, None, Some(41)), 52);
    }

    fn args(rate: &str) -> LinkArgs {
        LinkArgs { link_rate: Some(parse_rate_arg(rate).unwrap()), ..Default::default() }
    }

    #[test]
    fn links_settings_default_to_shallow_leaves_and_deep_spines() {
        let s = LinkSettings::from_args(&args("20mbit")).unwrap().unwrap();
        assert_eq!(s.rate_bps, 20_000_000);
        assert_eq!((s.leaf_buffer, s.spine_buffer), (64 << 10, 1 << 20));
        assert_eq!((s.leaf_marking.kmin_bytes, s.leaf_marking.kmax_bytes), (16 << 10, 48 << 10));
        assert_eq!(rate_text(s.rate_bps), "20mbit");
        assert_eq!(size_text(s.spine_buffer), "1m");
        assert!(LinkSettings::from_args(&LinkArgs::default()).unwrap().is_none());
        let e = LinkSettings::from_args(&args("100kbit")).unwrap_err().to_string();
        assert!(e.contains("1mbit..10gbit"), "{e}");
        let mut a = args("20mbit");
        a.leaf_buffer = Some(1000);
        assert!(LinkSettings::from_args(&a).unwrap_err().to_string().contains("--leaf-buffer"));
        a.leaf_buffer = None;
        a.ecn_kmin = Some(50_000);
        a.ecn_kmax = Some(10_000);
        assert!(LinkSettings::from_args(&a).unwrap_err().to_string().contains("above --ecn-kmax"));
    }

    #[test]
    fn links_rate_and_size_spellings() {
        assert_eq!(parse_rate_arg("200mbit").unwrap(), 200_000_000);
        assert_eq!(parse_rate_arg("1Gbit").unwrap(), 1_000_000_000);
        assert_eq!(parse_rate_arg("1500000").unwrap(), 1_500_000);
        assert!(parse_rate_arg("fast").is_err());
        assert_eq!(parse_size_arg("64k").unwrap(), 65536);
        assert_eq!(parse_size_arg("1m").unwrap(), 1 << 20);
        assert_eq!(parse_size_arg("150KB").unwrap(), 150_000);
        assert_eq!(parse_size_arg("4096").unwrap(), 4096);
        assert!(parse_size_arg("-3").is_err());
    }

    #[test]
    fn links_go_through_the_wire_named_by_direction() {
        let s = LinkSettings::from_args(&args("20mbit")).unwrap().unwrap();
        let mut plan = WirePlan::new("lab");
        let link = VethPlan {
            a_ns: "lab-l1".into(),
            a_if: "s1p1".into(),
            a_mac: [2, 0, 0, 0, 0, 1],
            a_addrs: vec!["172.17.17.1/24".into()],
            b_ns: "lab-s1".into(),
            b_if: "l1p1".into(),
            b_mac: [2, 0, 0, 0, 0, 2],
            b_addrs: vec!["172.17.17.2/24".into()],
            gro_b: false,
        };
        let [x, y] = plan.add(link, Sender::Switch(Switch::Leaf(1)), Sender::Switch(Switch::Spine(1)), Some(&s));
        assert_eq!(
            (x.a_ns.as_str(), x.a_if.as_str(), x.b_ns.as_str(), x.b_if.as_str()),
            ("lab-l1", "s1p1", "lab-wire", "s1-l1p1")
        );
        assert_eq!(
            (y.a_ns.as_str(), y.a_if.as_str(), y.b_ns.as_str(), y.b_if.as_str()),
            ("lab-wire", "l1-s1p1", "lab-s1", "l1p1")
        );
        assert_eq!(x.a_addrs, ["172.17.17.1/24"]);
        assert_eq!(y.b_addrs, ["172.17.17.2/24"]);
        assert_eq!(plan.bridges, [("br1".to_string(), ["s1-l1p1".to_string(), "l1-s1p1".to_string()])]);
        let links: Vec<(&str, u64)> = plan.queues.iter().map(|q| (q.link.as_str(), q.buffer)).collect();
        assert_eq!(links, [("s1/l1p1", 1 << 20), ("l1/s1p1", 64 << 10)]);
        let host = VethPlan {
            a_ns: "lab-l1".into(),
            a_if: "h1".into(),
            b_ns: "lab-r1h1".into(),
            b_if: "eth0".into(),
            gro_b: true,
            ..x.clone()
        };
        let [_, y] = plan.add(host, Sender::Switch(Switch::Leaf(1)), Sender::Host(1, 1), Some(&s));
        assert!(y.gro_b);
        assert_eq!(plan.bridges[1].1, ["r1h1".to_string(), "l1-h1".to_string()]);
        let nic = &plan.queues[2];
        assert_eq!((nic.link.as_str(), nic.netns.as_str(), nic.dev.as_str()), ("r1h1/eth0", "lab-r1h1", "eth0"));
    }

    #[test]
    fn links_shaper_serves_control_first_from_its_own_fifo() {
        let cmds: Vec<String> = shaper_commands("l1-s1p1", 20_000_000, 65536).iter().map(|c| c.join(" ")).collect();
        assert!(cmds[0].starts_with("qdisc replace dev l1-s1p1 root handle 1: htb default 20"), "{cmds:?}");
        assert!(cmds[2].contains("classid 1:10 htb rate 2000000bit ceil 20000000bit") && cmds[2].ends_with("prio 0"));
        assert!(cmds[3].contains("classid 1:20 htb rate 18000000bit ceil 20000000bit"), "{cmds:?}");
        assert!(cmds[5].ends_with("bfifo limit 65536"));
        assert!(cmds[6].contains("match ip dsfield 0xc0 0xfc flowid 1:10"), "{cmds:?}");
    }

    #[test]
    fn links_switch_config_parses_with_an_egress_per_port() {
        let s = LinkSettings::from_args(&args("20mbit")).unwrap().unwrap();
        let text = format!(
            "[[port]]\nname = \"h1\"\n[[port]]\nname = \"s1p1\"\n{}",
            switch_config(&s, Switch::Leaf(1), &["h1".into(), "s1p1".into()])
        );
        let c = crate::control::config::Config::parse(&text, std::path::Path::new("l1.toml"))
            .unwrap_or_else(|e| panic!("{e}\n{text}"));
        assert_eq!(c.egress.len(), 2);
        assert_eq!(c.egress[1].rate_bytes_per_sec, 2_500_000);
        assert_eq!(c.ecn_profiles[0].kmin_bytes, 16 << 10);
        assert_eq!(c.classes.len(), 2);
    }
}
