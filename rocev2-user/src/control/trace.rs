//! `rocev2 trace`: each matching RoCEv2 packet's forwarding decision, as it
//! happens. The filter goes into the running dataplane's TRACE_FILTER map;
//! the XDP program writes the decision of every matching packet (after its
//! headers were rewritten: route group, member, egress, class priority,
//! DSCP/ECN as it leaves) into a ring buffer, which this command reads. The
//! bucket and the flowlet state are worked out here with `explain`'s code,
//! from the packet's flow key and the live maps.
//!
//! It rides on the telemetry hook (`telemetry_qps` must be on): with
//! telemetry off the code is not in the verified program at all, and with
//! it on and no trace running it costs one array lookup per packet.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use aya::maps::{Array, MapData, RingBuf};
use rocev2_common::telemetry::{
    names, TraceEvent, TraceFilter, TRACE_MATCH_DST, TRACE_MATCH_OPCODE, TRACE_MATCH_PORT, TRACE_MATCH_QP,
    TRACE_MATCH_SRC,
};
use serde::Serialize;

use crate::{
    control::config::Config,
    control::decision::{explain, parse_qp, read_live, PacketFields, Verdict},
    control::qp_telemetry::{self, words_addr},
    control::state::RunState,
    control::top::member_name,
    sys::signals::SigintGuard,
};

#[derive(clap::Args, Debug, Clone)]
pub struct TraceArgs {
    /// Config of the running instance (to find its pin_dir). Without
    /// --config or --pin-dir: /etc/rocev2/rocev2.toml if it exists,
    /// else the default pin directory /sys/fs/bpf/rocev2.
    #[arg(long, short, value_name = "FILE", conflicts_with = "pin_dir")]
    pub config: Option<PathBuf>,
    /// Pin directory of the running instance.
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    pub pin_dir: Option<PathBuf>,
    /// Only packets from this address.
    #[arg(long)]
    pub src: Option<IpAddr>,
    /// Only packets to this address.
    #[arg(long)]
    pub dst: Option<IpAddr>,
    /// Only this BTH DestQP (e.g. 0x100).
    #[arg(long, value_parser = parse_qp)]
    pub qp: Option<u32>,
    /// Only this BTH opcode (e.g. 0x06 for WRITE FIRST, 0x11 for ACK).
    #[arg(long, value_parser = parse_opcode)]
    pub opcode: Option<u8>,
    /// Only this UDP source port (a number, as `explain --sport` takes it;
    /// not an interface).
    #[arg(long, visible_alias = "sport", value_name = "UDP_SPORT")]
    pub port: Option<u16>,
    /// Stop after this many packets.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// One JSON object per packet.
    #[arg(long)]
    pub json: bool,
}

fn parse_opcode(text: &str) -> Result<u8, String> {
    let t = text.trim();
    let v = match t.strip_prefix("0x") {
        Some(hex) => u8::from_str_radix(hex, 16),
        None => t.parse(),
    };
    v.map_err(|_| format!("{text:?} is not an opcode; use a number such as 0x06 (WRITE FIRST) or 0x11 (ACK)"))
}

/// One traced packet, as printed.
#[derive(Clone, Debug, Serialize)]
pub struct TraceLine {
    pub src: IpAddr,
    pub src_port: u16,
    pub dst: IpAddr,
    pub dest_qp: u32,
    pub opcode: u8,
    pub psn: u32,
    pub bytes: u32,
    pub group: String,
    pub member: String,
    /// The hash bucket and how the policy picked the member (`explain`).
    pub bucket: Option<u32>,
    pub policy_step: Option<String>,
    pub dscp: u8,
    pub ecn: &'static str,
    pub priority: u32,
}

impl TraceLine {
    pub fn render(&self) -> String {
        format!(
            "{}:{} > {} qp {:#x} op {:#04x} psn {} {}B -> group {} bucket {} member {}{} dscp {} ecn {}{}",
            self.src,
            self.src_port,
            self.dst,
            self.dest_qp,
            self.opcode,
            self.psn,
            self.bytes,
            self.group,
            self.bucket.map_or("-".into(), |b| b.to_string()),
            self.member,
            self.policy_step.as_ref().map_or(String::new(), |s| format!(" ({s})")),
            self.dscp,
            self.ecn,
            if self.priority != 0 { format!(" priority {}", self.priority) } else { String::new() },
        )
    }
}

fn ecn_name(tos: u8) -> &'static str {
    match tos & 3 {
        0 => "not-ect",
        1 => "ect1",
        2 => "ect0",
        _ => "CE",
    }
}

/// The filter as the dataplane reads it.
pub fn filter(args: &TraceArgs) -> Result<TraceFilter> {
    let mut f = TraceFilter { active: 1, ..Default::default() };
    let family = |a: IpAddr| if a.is_ipv4() { 4 } else { 6 };
    if let (Some(s), Some(d)) = (args.src, args.dst) {
        if s.is_ipv4() != d.is_ipv4() {
            bail!("--src {s} and --dst {d} must both be IPv4 or both IPv6");
        }
    }
    if let Some(s) = args.src {
        f.matches |= TRACE_MATCH_SRC;
        f.family = family(s);
        f.src = crate::control::qp_telemetry::addr_words(s);
    }
    if let Some(d) = args.dst {
        f.matches |= TRACE_MATCH_DST;
        f.family = family(d);
        f.dst = crate::control::qp_telemetry::addr_words(d);
    }
    if let Some(qp) = args.qp {
        if qp > 0xFF_FFFF {
            bail!("--qp {qp:#x} is wider than the BTH's 24-bit DestQP");
        }
        f.matches |= TRACE_MATCH_QP;
        f.dest_qp = qp;
    }
    if let Some(op) = args.opcode {
        f.matches |= TRACE_MATCH_OPCODE;
        f.opcode = u32::from(op);
    }
    if let Some(p) = args.port {
        f.matches |= TRACE_MATCH_PORT;
        f.src_port = u32::from(p);
    }
    Ok(f)
}

/// Clears the filter when the trace ends, however it ends.
struct ActiveFilter(Array<MapData, TraceFilter>);

impl Drop for ActiveFilter {
    fn drop(&mut self) {
        let _ = self.0.set(0, TraceFilter::default(), 0);
    }
}

pub fn run(pin_dir: &Path, args: &TraceArgs) -> Result<u64> {
    if let Some(d) = args.duration {
        anyhow::ensure!(d.is_finite() && d > 0.0, "--duration must be a positive number of seconds");
    }
    let wanted = filter(args)?;
    let state = RunState::read_with_telemetry(pin_dir, ", which trace rides on")?;
    let config = Config::load(&state.config).ok();
    let live = config.as_ref().and_then(|c| read_live(c).ok());
    let mut ring = RingBuf::try_from(qp_telemetry::open(pin_dir, names::TRACE_EVENTS)?).context("TRACE_EVENTS")?;
    // Events left by an earlier trace are not this one's.
    while ring.next().is_some() {}
    let mut filter: Array<MapData, TraceFilter> =
        Array::try_from(qp_telemetry::open(pin_dir, names::TRACE_FILTER)?).context("TRACE_FILTER")?;
    if filter.get(&0, 0)?.active != 0 {
        bail!("another `rocev2 trace` is running on this dataplane (one at a time)");
    }
    filter.set(0, wanted, 0).context("cannot set the trace filter")?;
    let _active = ActiveFilter(filter);
    let _sigint = SigintGuard::install();
    eprintln!("tracing (Ctrl-C to stop)");
    let start = Instant::now();
    let mut seen = 0u64;
    loop {
        let mut got_one = false;
        while let Some(item) = ring.next() {
            got_one = true;
            if item.len() < size_of::<TraceEvent>() {
                continue;
            }
            // SAFETY: the program writes whole TraceEvents; read unaligned.
            let e: TraceEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            let line = describe(&e, &state, config.as_ref(), live.as_ref());
            if args.json {
                println!("{}", serde_json::to_string(&line)?);
            } else {
                println!("{}", line.render());
            }
            seen += 1;
            if args.count.is_some_and(|c| seen >= c) {
                return Ok(seen);
            }
        }
        if args.duration.is_some_and(|d| start.elapsed().as_secs_f64() >= d) || SigintGuard::interrupted() {
            return Ok(seen);
        }
        if !got_one {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn describe(
    e: &TraceEvent,
    state: &RunState,
    config: Option<&Config>,
    live: Option<&crate::control::decision::Live>,
) -> TraceLine {
    let (src, dst) = (words_addr(&e.src, e.family), words_addr(&e.dst, e.family));
    let (group, mut member) = member_name(state, e.group, e.position);
    if e.group == rocev2_common::maps::BRIDGE_PORT_GROUP {
        // Bridge mode: the port the FDB named, by its ifindex.
        member = state.ports.iter().find(|p| p.ifindex == e.ifindex).map_or(member, |p| p.name.clone());
    }
    let packet = PacketFields {
        src,
        dst,
        protocol: 17,
        src_port: e.src_port,
        dst_port: rocev2_common::bth::ROCEV2_UDP_PORT,
        dest_qp: Some(e.dest_qp),
    };
    let forwarding = config.and_then(|c| match explain(c, live, &packet).verdict {
        Verdict::Forward(f) | Verdict::Uplink { forwarding: f, .. } => Some(f),
        _ => None,
    });
    TraceLine {
        src,
        src_port: e.src_port,
        dst,
        dest_qp: e.dest_qp,
        opcode: e.opcode,
        psn: e.psn,
        bytes: e.len,
        group,
        member,
        bucket: forwarding.as_ref().map(|f| f.bucket),
        policy_step: forwarding.and_then(|f| f.policy_step),
        dscp: e.tos >> 2,
        ecn: ecn_name(e.tos),
        priority: e.priority,
    }
}
