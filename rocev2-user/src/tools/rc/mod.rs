//! Reliable Connected (RC) endpoints for the lab: `gen --rc` is a requester
//! and `sink --rc` a responder, behaving the way go-back-N RDMA NICs do.
//!
//! Without Soft-RoCE or an RDMA NIC, nothing in a lab ever sent an ACK or a
//! NAK, so the price of loss or reordering (a whole window sent again) was
//! invisible. These two ends make it visible:
//!
//! - The responder accepts only the next expected PSN of each QP. It sends
//!   a coalesced ACK (the last PSN accepted) on every AckReq packet, every
//!   `--ack-every` in-order packets and when the link goes quiet; on a PSN
//!   ahead of the expected one it drops the packet and sends one NAK with
//!   the PSN-sequence-error syndrome carrying the expected PSN (one NAK per
//!   error, until that PSN arrives); duplicates are dropped and, when they
//!   ask for it, ACKed again. CE-marked data makes it send a CNP, at most
//!   one per QP per [`CNP_INTERVAL`] (the DCQCN notification point).
//! - The requester keeps at most `--window` PSNs per QP unacknowledged, goes
//!   back to the NAKed PSN and sends everything from there again, and after
//!   `--ack-timeout-ms` without progress sends again from the oldest
//!   unacknowledged PSN. It reports per QP the packets sent, how many were
//!   retransmissions (and which ranges, why), NAKs, timeouts, completion
//!   time and goodput.
//!
//! Both ends number the QP alike (the requester's QP number is the DestQP
//! of the responder's ACKs), as `gen` already does for its source ports, and
//! the ACKs leave with the data's UDP source port, as a NIC derives it from
//! both QP numbers.

//!
//! Reacting to congestion (`--transport`): with `dcqcn` every requester
//! QP's rate follows DCQCN ([`dcqcn`]) on the CNPs the responder sends for
//! CE-marked data; with `cts` the requester asks before each message (RTS)
//! and the responder grants messages (CTS) within a window of bytes
//! ([`admission`]), receiver-driven admission as in Meta's fabric. ACKs,
//! NAKs, CNPs, RTSs and CTSs travel in the high-priority class (DSCP 48).
//! Both ends are an [`Endpoint`]; `rocev2 lab collective` runs one per host.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use rocev2_common::bth::PSN_MASK;
use serde::Serialize;

use crate::{
    render::{Align::*, Table},
    tools::gen::{nic_sport, parse_mac, GenArgs, SportModel},
};

pub mod admission;
pub mod dcqcn;
mod endpoint;
mod requester;
pub(crate) mod responder;
pub mod transport;

pub use endpoint::{Endpoint, EndpointConfig, EndpointReport, Event};
pub use requester::{RequesterQpReport, Retransmission};
pub use responder::{
    data_bytes, render_responder, Delivered, Responder, ResponderQpReport, CNP_INTERVAL, CONTROL_DSCP,
};
pub use transport::Transport;

/// The requester gives up after this long without completing (a lab whose
/// path is down should not hang a test).
const GIVE_UP_AFTER: Duration = Duration::from_secs(30);
/// The data socket's send buffer of `gen --rc`: the NIC queue.
const NIC_QUEUE_BYTES: usize = 256 << 10;
/// Frame bytes around a WRITE packet's payload (IPv6, the larger).
const FRAME_OVERHEAD: u64 = 78;

/// What `gen --rc` did.
#[derive(Clone, Debug, Serialize)]
pub struct RequesterReport {
    pub dev: String,
    pub window: u32,
    pub transport: Transport,
    pub packets: u64,
    pub retransmitted: u64,
    pub sequence_naks: u64,
    pub timeouts: u64,
    pub elapsed_secs: f64,
    pub goodput_gbps: f64,
    pub complete: bool,
    pub qps: Vec<RequesterQpReport>,
}

impl RequesterReport {
    pub fn qp(&self, dest_qp: u32) -> Option<&RequesterQpReport> {
        self.qps.iter().find(|q| q.dest_qp == dest_qp)
    }

    pub fn render(&self) -> String {
        let mut s = format!(
            "rocev2 gen --rc on {}: {} QPs {}, {} packets sent ({} retransmitted), {} sequence NAKs, {} timeouts, {:.3} s, goodput {:.3} Gbit/s (window {}{})\n",
            self.dev,
            self.qps.len(),
            if self.complete { "complete" } else { "NOT complete" },
            self.packets,
            self.retransmitted,
            self.sequence_naks,
            self.timeouts,
            self.elapsed_secs,
            self.goodput_gbps,
            self.window,
            match self.transport {
                Transport::None => String::new(),
                t => format!(", transport {}", t.name()),
            }
        );
        let lost: u64 = self.qps.iter().map(|q| q.lost_at_sender).sum();
        if lost > 0 {
            s.push_str(&format!("  sends the local egress refused (ENOBUFS): {lost}, recovered like any loss\n"));
        }
        if self.transport == Transport::Dcqcn {
            let (cnps, cuts) = self.qps.iter().fold((0, 0), |(c, k), q| (c + q.cnps, k + q.rate_cuts));
            let low = self.qps.iter().filter_map(|q| q.min_rate_bps).fold(f64::INFINITY, f64::min);
            s.push_str(&format!("  DCQCN: {cnps} CNPs, {cuts} rate cuts, lowest rate {:.3} Mbit/s\n", low / 1e6));
        }
        let mut table = Table::new(&[
            ("QP", Right),
            ("PSNS", Right),
            ("SENT", Right),
            ("RETX", Right),
            ("SEQ NAK", Right),
            ("RNR", Right),
            ("TIMEOUT", Right),
            ("DONE (s)", Right),
            ("GOODPUT Gb/s", Right),
            ("RETRANSMITTED", Left),
        ])
        .indent(1);
        for q in &self.qps {
            let ranges: Vec<String> =
                q.retransmissions.iter().map(|r| format!("{}..={} ({})", r.from_psn, r.to_psn, r.cause)).collect();
            table.row([
                format!("{:#x}", q.dest_qp),
                q.psns.to_string(),
                q.sent.to_string(),
                q.retransmitted.to_string(),
                q.sequence_naks.to_string(),
                q.rnr_naks.to_string(),
                q.timeouts.to_string(),
                if q.complete { format!("{:.4}", q.completion_secs) } else { "-".into() },
                format!("{:.3}", q.goodput_gbps),
                if ranges.is_empty() { "-".into() } else { ranges.join(", ") },
            ]);
        }
        s.push_str(&table.render());
        s
    }
}

/// Checks the RC options of `gen`.
pub fn validate_requester(args: &GenArgs) -> Result<()> {
    if args.window == 0 {
        bail!("--window must be at least 1");
    }
    let psns = u64::from(args.messages) * u64::from(args.message_packets);
    if psns == 0 || psns >= u64::from(PSN_MASK / 2) {
        bail!("--messages x --message-packets must be 1..{} PSNs per QP, not {psns}", PSN_MASK / 2);
    }
    if args.ack_timeout_ms == 0 {
        bail!("--ack-timeout-ms must be at least 1");
    }
    if args.mode != crate::tools::gen::GenMode::Packet {
        bail!("--rc sends through a packet socket; leave out --mode live-frames");
    }
    match args.transport {
        Transport::Dcqcn if args.rate.is_none() => {
            bail!("--transport dcqcn needs --rate: the line rate (packets/s) every QP starts at and climbs back to")
        }
        Transport::Cts if args.first_qp % 64 + args.qps > 63 => bail!(
            "--transport cts sends its RTSs on the control QP {:#x} (the data QPs' number with the low 6 bits set), which --first-qp {:#x} and --qps {} reach; start the QPs at a multiple of 64",
            admission::control_qp(args.first_qp),
            args.first_qp,
            args.qps
        ),
        _ => {}
    }
    Ok(())
}

/// `gen --rc`: delivers `--messages` WRITE messages on every QP, reliably.
pub fn request(args: &GenArgs) -> Result<RequesterReport> {
    validate_requester(args)?;
    let mac = match &args.src_mac {
        Some(m) => parse_mac(m).context("--src-mac")?,
        None => crate::sys::device_mac(&args.dev)?,
    };
    let frame_bytes = args.payload as u64 + FRAME_OVERHEAD;
    let cfg = EndpointConfig {
        dev: args.dev.clone(),
        local_ip: args.src,
        mac,
        next_hop_mac: parse_mac(&args.dst_mac).context("--dst-mac")?,
        transport: args.transport,
        window: args.window,
        ack_timeout: Duration::from_millis(args.ack_timeout_ms),
        ack_every: 8,
        mtu: args.payload as u32,
        first_psn: args.first_psn,
        dcqcn: args.rate.map(|pps| dcqcn::DcqcnParams::for_link(pps * frame_bytes * 8, frame_bytes)),
        cts_window: 0,
        nic_queue_bytes: NIC_QUEUE_BYTES,
        data_dscp: args.dscp,
        data_ecn: args.ecn.codepoint(),
    };
    let mut endpoint = Endpoint::open(cfg)?;
    let mut rng = args.seed;
    let message_bytes = u64::from(args.message_packets) * args.payload as u64;
    for q in 0..args.qps {
        let qp = args.first_qp + q;
        let sport = match args.sport {
            SportModel::Fixed => args.sport_value,
            SportModel::Nic => nic_sport(qp, qp),
            SportModel::Random => 0xC000 | (rocev2_common::rng::splitmix64(&mut rng) as u16 & 0x3FFF),
        };
        endpoint.add_qp(args.dst, qp, sport);
    }
    // Every QP's first message, then every QP's second, ...
    for _ in 0..args.messages {
        for q in 0..args.qps {
            endpoint.post(args.dst, args.first_qp + q, message_bytes)?;
        }
    }
    let give_up = args.duration.map_or(GIVE_UP_AFTER, Duration::from_secs_f64);
    while !endpoint.sent_everything() && endpoint.started().elapsed() < give_up {
        endpoint.poll(Duration::from_millis(1))?;
    }
    let elapsed = endpoint.started().elapsed().as_secs_f64().max(1e-9);
    let done = endpoint.finish();
    let mut report = RequesterReport {
        dev: args.dev.clone(),
        window: args.window,
        transport: args.transport,
        packets: done.data_frames,
        retransmitted: 0,
        sequence_naks: 0,
        timeouts: 0,
        elapsed_secs: elapsed,
        goodput_gbps: 0.0,
        complete: true,
        qps: Vec::new(),
    };
    let mut delivered = 0u64;
    for r in done.requesters {
        if r.complete {
            delivered += u64::from(r.psns);
        }
        report.retransmitted += r.retransmitted;
        report.sequence_naks += r.sequence_naks;
        report.timeouts += r.timeouts;
        report.complete &= r.complete;
        report.qps.push(r);
    }
    report.goodput_gbps = delivered as f64 * args.payload as f64 * 8.0 / elapsed / 1e9;
    Ok(report)
}
