//! `rocev2 sink`: receive RoCEv2 traffic on one interface and check it.
//!
//! The receiving end of `rocev2 gen` (or of any RoCEv2 traffic): counts
//! packets per QP (source, destination, DestQP), checks the ICRC of every
//! packet, counts ECN codepoints and CE marks, and follows each QP's PSNs.
//! A PSN below the next expected one is a *reordered* packet: what a path
//! change inside a message causes, e.g. a flowlet gap shorter than the
//! delay difference between two paths. RDMA NICs treat that as loss
//! (go-back-N), so it must stay at zero.

pub mod tally;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use self::tally::Tally;
pub use self::tally::{EcnCounts, QpReport, SinkReport};
use crate::{sys::rawsock::PacketSocket, sys::signals::SigintGuard, tools::packet::parse_roce, tools::rc::Responder};

/// `rocev2 sink`: count and check the RoCEv2 packets arriving on one interface.
#[derive(clap::Args, Debug, Clone)]
pub struct SinkArgs {
    /// Interface to receive on.
    #[arg(long)]
    pub dev: String,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Stop after this many RoCEv2 packets.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds without RoCEv2 packets, once some came.
    #[arg(long, default_value_t = 2.0)]
    pub idle_exit: f64,
    /// Be an RC responder (`gen --rc` is the requester): accept each QP's
    /// PSNs only in order, ACK (coalesced), NAK a PSN gap with the
    /// sequence-error syndrome, send CNPs for CE-marked data.
    #[arg(long)]
    pub rc: bool,
    /// --rc: ACK at least every this many in-order packets (and always on
    /// AckReq and when the link goes quiet).
    #[arg(long, default_value_t = 8)]
    pub ack_every: u32,
    /// --rc: the PSN every QP starts at (as agreed at connection setup).
    #[arg(long, default_value_t = 0)]
    pub first_psn: u32,
    /// --rc: the requester's transport (`gen --rc --transport`), as far as
    /// the responder takes part: `cts` grants each message with a CTS, at
    /// most --cts-window bytes outstanding; `none` and `dcqcn` answer
    /// alike (a CNP for CE-marked data either way: DCQCN is how the
    /// requester reacts to it).
    #[arg(long, value_enum, default_value = "none", requires = "rc", hide_possible_values = true)]
    pub transport: crate::tools::rc::Transport,
    /// --rc --transport cts: bytes granted and not yet received, at most
    /// (a message is granted whole, one at a time at least).
    #[arg(long, value_parser = crate::control::config::parse_size_arg, default_value = "144k")]
    pub cts_window: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

impl SinkArgs {
    pub fn new(dev: &str) -> Self {
        Self {
            dev: dev.to_owned(),
            duration: None,
            count: None,
            idle_exit: 2.0,
            rc: false,
            ack_every: 8,
            first_psn: 0,
            transport: crate::tools::rc::Transport::None,
            cts_window: 144 << 10,
            json: false,
        }
    }
}

/// An open sink: the socket exists, so traffic sent from now on is counted.
pub struct Sink {
    socket: PacketSocket,
    args: SinkArgs,
}

impl Sink {
    pub fn open(args: &SinkArgs) -> Result<Self> {
        if let Some(d) = args.duration {
            anyhow::ensure!(d.is_finite() && d > 0.0, "--duration must be a positive number of seconds");
        }
        anyhow::ensure!(
            args.idle_exit.is_finite() && args.idle_exit > 0.0,
            "--idle-exit must be a positive number of seconds"
        );
        let socket =
            PacketSocket::open(&args.dev).with_context(|| format!("cannot open a packet socket on {:?}", args.dev))?;
        Ok(Self { socket, args: args.clone() })
    }

    /// Receives until --count packets, --duration, --idle-exit seconds of
    /// silence after the first packet, or SIGINT.
    pub fn receive(self) -> Result<SinkReport> {
        let _sigint = SigintGuard::install();
        let start = Instant::now();
        let duration = self.args.duration.map(Duration::from_secs_f64);
        let idle = Duration::from_secs_f64(self.args.idle_exit);
        let mut tally = Tally::default();
        let mut responder = self.args.rc.then(|| {
            let r = Responder::new(self.args.first_psn, self.args.ack_every);
            match self.args.transport {
                crate::tools::rc::Transport::Cts => r.with_admission(self.args.cts_window),
                _ => r,
            }
        });
        // A responder answers quiet links quickly (its coalesced ACKs).
        let poll = if responder.is_some() { Duration::from_millis(1) } else { Duration::from_millis(100) };
        let (mut first, mut last): (Option<Instant>, Option<Instant>) = (None, None);
        let mut buf = vec![0u8; 65536];
        loop {
            if self.args.count.is_some_and(|c| tally.report.packets >= c)
                || duration.is_some_and(|d| start.elapsed() >= d)
                || SigintGuard::interrupted()
            {
                break;
            }
            // Idle is judged only when a receive found no RoCEv2 frame, so
            // frames queued while this thread was not scheduled still count.
            let idle_now = || last.is_some_and(|t: Instant| t.elapsed() >= idle);
            let Some(n) =
                self.socket.recv(&mut buf, poll).with_context(|| format!("receiving on {}", self.args.dev))?
            else {
                if let Some(r) = responder.as_mut() {
                    self.send_all(r.flush())?;
                }
                if idle_now() {
                    break;
                }
                continue;
            };
            let before = tally.report.packets;
            tally.frame(&buf[..n]);
            if let Some(r) = responder.as_mut() {
                if let Ok(p) = parse_roce(&buf[..n]) {
                    self.send_all(r.frame_with(&p, &buf[..n]))?;
                }
            }
            if tally.report.packets > before {
                let now = Instant::now();
                first.get_or_insert(now);
                last = Some(now);
            } else if idle_now() {
                break;
            }
        }
        let elapsed = match (first, last) {
            (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
            _ => 0.0,
        };
        let mut report = tally.finish(&self.args.dev, elapsed);
        report.responder = responder.map(|r| r.report()).unwrap_or_default();
        report.observer_dropped =
            self.socket.drops().with_context(|| format!("reading {}'s drop count", self.args.dev))?;
        Ok(report)
    }

    fn send_all(&self, frames: Vec<Vec<u8>>) -> Result<()> {
        for f in frames {
            self.socket.send(&f).with_context(|| format!("sending an ACK on {}", self.args.dev))?;
        }
        Ok(())
    }
}

/// `rocev2 sink`: receive, then print and return the report.
pub fn run(args: &SinkArgs) -> Result<SinkReport> {
    let report = Sink::open(args)?.receive()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", report.render());
    }
    Ok(report)
}
