//! An RC endpoint on one interface: the requester QPs of its outgoing
//! connections and the responder of its incoming ones, driven by one loop
//! ([`Endpoint::poll`]) the way a NIC and a collective library's proxy
//! thread are. `gen --rc` is an endpoint that only sends, `rocev2 lab
//! collective` runs one per host.
//!
//! Two packet sockets, as a NIC has two classes: data goes out of one whose
//! send buffer is the NIC's queue (a full buffer makes the requester wait,
//! as a NIC never drops what its host gives it), and ACKs, NAKs, CNPs and
//! RTS/CTS out of another, so they never wait behind data.

use std::{
    collections::HashMap,
    io,
    net::IpAddr,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use rocev2_common::{
    bth::{aeth, opcode, Bth, BTH_LEN, PSN_MASK},
    telemetry::{seen, Seen},
};
use serde::Serialize;

use super::{
    admission::{self, Control, Kind},
    dcqcn::{Dcqcn, DcqcnParams},
    requester::{RequesterQpReport, SendQp},
    responder::{Delivered, Responder, ResponderQpReport, CONTROL_DSCP},
    transport::Transport,
};
use crate::{
    sys::rawsock::PacketSocket,
    tools::packet::{parse_roce, ParsedRoce, RoceFrameSpec},
    tools::sink::tally::{Arrival, SinkReport, Tally},
};

/// Data packets a requester QP sends in a row before the next QP's turn.
const BURST: u32 = 4;
/// The endpoint sends its responder's pending ACKs once no frame came for
/// this long, and a QP's pending ACK once its oldest unacknowledged packet
/// waited this long (a NIC's ACK coalescing timer).
const QUIET: Duration = Duration::from_micros(500);
const ACK_DELAY: Duration = Duration::from_millis(1);
/// The longest an idle endpoint sleeps between looks at its timers.
const MAX_WAIT: Duration = Duration::from_millis(5);

/// What an endpoint is.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    pub dev: String,
    pub local_ip: IpAddr,
    /// Its own MAC and the next hop's (the switch port it is cabled to).
    pub mac: [u8; 6],
    pub next_hop_mac: [u8; 6],
    pub transport: Transport,
    /// Unacknowledged PSNs per requester QP.
    pub window: u32,
    pub ack_timeout: Duration,
    /// The responder ACKs at least every this many in-order packets.
    pub ack_every: u32,
    /// RDMA payload bytes per packet.
    pub mtu: u32,
    /// The PSN every QP starts at.
    pub first_psn: u32,
    /// `Transport::Dcqcn`: the reaction point's parameters.
    pub dcqcn: Option<DcqcnParams>,
    /// `Transport::Cts`: the bytes a receiver grants ahead.
    pub cts_window: u64,
    /// The data socket's send buffer: the NIC queue's depth.
    pub nic_queue_bytes: usize,
    pub data_dscp: u8,
    /// ECN codepoint of the data (ECT(0) = 2).
    pub data_ecn: u8,
}

/// What happened in one [`Endpoint::poll`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A message of an incoming connection arrived whole and in order.
    Delivered(Delivered),
    /// Every packet of outgoing message `message` of QP `qp` to `peer` is acknowledged.
    Completed { peer: IpAddr, qp: u32, message: u32 },
}

/// Everything an endpoint counted.
#[derive(Clone, Debug, Default, Serialize)]
pub struct EndpointReport {
    pub dev: String,
    pub transport: Transport,
    /// Frames sent: data (retransmissions included) and control.
    pub data_frames: u64,
    pub data_bytes: u64,
    pub control_frames: u64,
    /// Frames the local egress refused (ENOBUFS, or a full control socket):
    /// lost before the wire, repaired like any loss.
    pub lost_at_sender: u64,
    /// Sends that found the NIC queue (the data socket's buffer) full and waited.
    pub nic_waits: u64,
    pub requesters: Vec<RequesterQpReport>,
    pub responders: Vec<ResponderQpReport>,
    /// Every RoCEv2 frame received, checked like `sink` does (ICRC, PSN order, ECN).
    pub received: SinkReport,
    /// Late packets (a PSN below one already seen on its QP, seen for the
    /// first time), when each arrived (seconds from the start), for telling
    /// a network's reordering from a retransmission.
    #[serde(skip)]
    pub late: Vec<(IpAddr, u32, u32, Duration)>,
    /// Admission: RTS received, CTS sent, RTS repeated.
    pub rts_received: u64,
    pub cts_sent: u64,
    pub rts_repeated: u64,
}

/// One RC endpoint (see the module).
pub struct Endpoint {
    cfg: EndpointConfig,
    data: PacketSocket,
    control: PacketSocket,
    base: RoceFrameSpec,
    control_base: RoceFrameSpec,
    qps: Vec<SendQp>,
    by_qp: HashMap<(IpAddr, u32), usize>,
    /// The next PSN of every control QP this endpoint sends RTSs on.
    control_psns: HashMap<(IpAddr, u32), u32>,
    responder: Responder,
    tally: Tally,
    start: Instant,
    last_frame: Instant,
    /// The data socket's buffer was full at the last try.
    blocked: bool,
    /// Sends nothing more, only receives ([`Endpoint::stop_answering`]).
    quiet: bool,
    turn: usize,
    report: EndpointReport,
    buf: Vec<u8>,
}

impl Endpoint {
    /// Opens the sockets (in the calling thread's network namespace).
    pub fn open(cfg: EndpointConfig) -> Result<Self> {
        let data =
            PacketSocket::open(&cfg.dev).with_context(|| format!("cannot open a packet socket on {:?}", cfg.dev))?;
        data.set_send_buffer(cfg.nic_queue_bytes).context("sizing the data socket's send buffer")?;
        let control = PacketSocket::open_sender(&cfg.dev)
            .with_context(|| format!("cannot open a packet socket on {:?}", cfg.dev))?;
        let base = RoceFrameSpec {
            src_mac: cfg.mac,
            dst_mac: cfg.next_hop_mac,
            vlan: None,
            src_ip: cfg.local_ip,
            dst_ip: cfg.local_ip,
            ttl: crate::tools::gen::GEN_TTL,
            dscp: cfg.data_dscp,
            ecn: cfg.data_ecn,
            src_port: 0xC000,
            bth: Bth::new(0, 0, 0),
            payload_len: 0,
        };
        let control_base = RoceFrameSpec { dscp: CONTROL_DSCP, ecn: 0, ..base.clone() };
        let mut responder = Responder::new(cfg.first_psn, cfg.ack_every);
        if cfg.transport == Transport::Cts {
            responder = responder.with_admission(cfg.cts_window);
        }
        let now = Instant::now();
        let report = EndpointReport { dev: cfg.dev.clone(), transport: cfg.transport, ..Default::default() };
        Ok(Self {
            cfg,
            data,
            control,
            base,
            control_base,
            qps: Vec::new(),
            by_qp: HashMap::new(),
            control_psns: HashMap::new(),
            responder,
            tally: Tally::default(),
            start: now,
            last_frame: now,
            blocked: false,
            quiet: false,
            turn: 0,
            report,
            buf: vec![0u8; 65536],
        })
    }

    /// Adds a requester QP numbered `qp` to `peer` with UDP source port `sport`.
    pub fn add_qp(&mut self, peer: IpAddr, qp: u32, sport: u16) {
        let now = Instant::now();
        let mut q = SendQp::new(qp, sport, peer, self.cfg.first_psn, self.cfg.mtu, now);
        q.needs_grant = self.cfg.transport == Transport::Cts;
        if self.cfg.transport == Transport::Dcqcn {
            q.dcqcn = self.cfg.dcqcn.map(|p| Dcqcn::new(p, now));
        }
        self.by_qp.insert((peer, qp), self.qps.len());
        self.qps.push(q);
    }

    /// Posts a message of `bytes` on QP `qp` to `peer`; returns its
    /// number on the QP. With admission its RTS goes out at once.
    pub fn post(&mut self, peer: IpAddr, qp: u32, bytes: u64) -> Result<u32> {
        let i = *self.by_qp.get(&(peer, qp)).with_context(|| format!("no QP {qp:#x} to {peer}"))?;
        let number = self.qps[i].post(bytes);
        if self.qps[i].needs_grant {
            self.ask(i, number)?;
        }
        Ok(number)
    }

    /// Sends the RTS of message `number` of QP `i`.
    fn ask(&mut self, i: usize, number: u32) -> Result<()> {
        let q = &mut self.qps[i];
        let Some(m) = q.messages.iter_mut().find(|m| m.number == number) else { return Ok(()) };
        m.asked = Some(Instant::now());
        let c =
            Control { kind: Kind::Rts, data_qp: q.qp, message: number, bytes: m.bytes.min(u64::from(u32::MAX)) as u32 };
        let mut spec = self.control_base.clone();
        spec.dst_ip = q.peer;
        spec.src_port = q.sport;
        let psn = self.control_psns.entry((q.peer, admission::control_qp(q.qp))).or_insert(0);
        let frame = c.frame(&spec, *psn);
        *psn = (*psn + 1) & PSN_MASK;
        self.send_control(&frame)
    }

    fn send_control(&mut self, frame: &[u8]) -> Result<()> {
        if self.quiet {
            return Ok(());
        }
        match self.control.try_send(frame) {
            Ok(()) => self.report.control_frames += 1,
            // A full control queue or qdisc: lost like on a wire (ACKs are
            // cumulative, NAKs and RTSs come again).
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOBUFS) | Some(libc::EAGAIN)) => {
                self.report.lost_at_sender += 1
            }
            Err(e) => return Err(e).with_context(|| format!("sending a control frame on {}", self.cfg.dev)),
        }
        Ok(())
    }

    /// From now on the endpoint only receives and counts: at the end of a
    /// run, so that nothing is still on the way when the counts are taken.
    pub fn stop_answering(&mut self) {
        self.quiet = true;
    }

    /// Every posted message of every requester QP acknowledged.
    pub fn sent_everything(&self) -> bool {
        self.qps.iter().all(SendQp::done)
    }

    pub fn started(&self) -> Instant {
        self.start
    }

    /// One round: takes every frame queued, runs the timers, sends what
    /// the windows, grants and rates allow, then waits at most `max_wait`
    /// for the next thing to do. Returns what completed.
    pub fn poll(&mut self, max_wait: Duration) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        let received = self.receive(&mut events)?;
        let now = Instant::now();
        let pending = if !received && now.duration_since(self.last_frame) >= QUIET {
            self.responder.flush()
        } else {
            self.responder.flush_older(ACK_DELAY)
        };
        for f in pending {
            self.send_control(&f)?;
        }
        for q in self.qps.iter_mut() {
            if let Some(d) = q.dcqcn.as_mut() {
                d.tick(now);
            }
            q.check_timeout(self.cfg.ack_timeout, self.start);
        }
        self.retry_requests()?;
        self.send_data()?;
        // Sleep until the next pacing slot or timer, or a frame arrives.
        let now = Instant::now();
        let sending = !self.blocked;
        let next = self.qps.iter().filter_map(|q| q.next_event(self.cfg.window, self.cfg.ack_timeout, sending)).min();
        let wait = next.map_or(MAX_WAIT, |t| t.saturating_duration_since(now)).min(max_wait).min(MAX_WAIT);
        if !wait.is_zero() {
            self.data.wait(wait, self.blocked).context("waiting on the data socket")?;
        }
        Ok(events)
    }

    fn retry_requests(&mut self) -> Result<()> {
        let due: Vec<(usize, u32)> = self
            .qps
            .iter()
            .enumerate()
            .flat_map(|(i, q)| {
                q.messages
                    .iter()
                    .filter(|m| !m.granted && m.asked.is_some_and(|t| t.elapsed() >= admission::RTS_RETRY))
                    .map(move |m| (i, m.number))
            })
            .collect();
        for (i, number) in due {
            self.ask(i, number)?;
        }
        Ok(())
    }

    /// Takes every queued frame; true if there was any.
    fn receive(&mut self, events: &mut Vec<Event>) -> Result<bool> {
        let mut any = false;
        while let Some(n) =
            self.data.recv_now(&mut self.buf).with_context(|| format!("receiving on {}", self.cfg.dev))?
        {
            let frame = self.buf[..n].to_vec();
            let Ok(p) = parse_roce(&frame) else { continue };
            if p.dst_ip != self.cfg.local_ip {
                continue;
            }
            any = true;
            self.last_frame = Instant::now();
            // Late data (not ACKs: an ACK names the last PSN accepted and a
            // NAK the next expected, so an ACK after a NAK looks one behind).
            if self.tally.frame(&frame) == Some(Arrival::Reordered)
                && seen(p.bth.opcode) == Seen::Data
                && Control::parse(&p, &frame).is_none()
            {
                self.report.late.push((p.src_ip, p.bth.dest_qp, p.bth.psn, self.start.elapsed()));
            }
            self.dispatch(&p, &frame, events)?;
        }
        Ok(any)
    }

    fn dispatch(&mut self, p: &ParsedRoce, frame: &[u8], events: &mut Vec<Event>) -> Result<()> {
        match p.bth.opcode {
            opcode::ACK => {
                let Some(&i) = self.by_qp.get(&(p.src_ip, p.bth.dest_qp)) else { return Ok(()) };
                let Some(&syndrome) = frame.get(p.bth_offset + BTH_LEN) else { return Ok(()) };
                let q = &mut self.qps[i];
                for message in q.acknowledged(p.bth.psn, syndrome, self.start) {
                    events.push(Event::Completed { peer: q.peer, qp: q.qp, message });
                }
                if aeth::kind(syndrome) != aeth::Kind::Ack {
                    // A NAK restarts the window: no reason to wait for the pacer.
                    q.next_send_at = q.next_send_at.min(Instant::now());
                }
            }
            opcode::CNP => {
                if let Some(&i) = self.by_qp.get(&(p.src_ip, p.bth.dest_qp)) {
                    if let Some(d) = self.qps[i].dcqcn.as_mut() {
                        d.on_cnp(Instant::now());
                    }
                }
            }
            _ => {
                if let Some(c) = Control::parse(p, frame) {
                    if c.kind == Kind::Cts {
                        if let Some(&i) = self.by_qp.get(&(p.src_ip, c.data_qp)) {
                            self.qps[i].grant(c.message);
                        }
                        return Ok(());
                    }
                }
                for f in self.responder.frame_with(p, frame) {
                    self.send_control(&f)?;
                }
                events.extend(self.responder.take_delivered().into_iter().map(Event::Delivered));
            }
        }
        Ok(())
    }

    /// Sends data round-robin over the QPs, a few packets each, until
    /// nothing may go or the NIC queue is full.
    fn send_data(&mut self) -> Result<()> {
        self.blocked = false;
        let n = self.qps.len();
        if n == 0 || self.quiet {
            return Ok(());
        }
        loop {
            let mut sent_any = false;
            for k in 0..n {
                let i = (self.turn + k) % n;
                for _ in 0..BURST {
                    let now = Instant::now();
                    if !self.qps[i].can_send(self.cfg.window, now) {
                        break;
                    }
                    let frame = self.qps[i].next_frame(&self.base);
                    match self.data.try_send(&frame) {
                        Ok(()) => {
                            self.report.data_frames += 1;
                            self.report.data_bytes += frame.len() as u64;
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            // The NIC queue is full: this packet goes next time.
                            self.report.nic_waits += 1;
                            self.blocked = true;
                            self.turn = i;
                            return Ok(());
                        }
                        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                            self.qps[i].report.lost_at_sender += 1;
                            self.report.lost_at_sender += 1;
                        }
                        Err(e) => return Err(e).with_context(|| format!("sending on {}", self.cfg.dev)),
                    }
                    self.qps[i].advance();
                    self.qps[i].paced(frame.len(), now);
                    sent_any = true;
                }
            }
            self.turn = (self.turn + 1) % n;
            if !sent_any {
                return Ok(());
            }
        }
    }

    /// The report.
    pub fn finish(mut self) -> EndpointReport {
        let elapsed = self.start.elapsed().as_secs_f64();
        let bits = f64::from(self.cfg.mtu) * 8.0;
        self.report.requesters = self.qps.into_iter().map(|q| q.finish(bits)).collect();
        self.report.responders = self.responder.report();
        if let Some(a) = self.responder.admission() {
            self.report.rts_received = a.requests;
            self.report.cts_sent = a.grants;
            self.report.rts_repeated = a.repeats;
        }
        self.report.received = self.tally.finish(&self.cfg.dev, elapsed);
        self.report
    }
}
