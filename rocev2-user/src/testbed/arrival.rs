//! Loss accounting that an observer cannot fool.
//!
//! A capture (an AF_PACKET socket, tcpdump) on a busy machine drops frames
//! that did arrive: its receive buffer fills while its thread waits for a
//! CPU. A test that counts captured frames then blames the switch for the
//! observer's loss. So every lab count of loss has two parts:
//!
//! - **arrival**, counted where the frame lands: an [`ArrivalProbe`] is
//!   an XDP program on the receiving device (the tools object's
//!   `rocev2_xdp_arrival`) that counts every RoCEv2 frame and follows each
//!   flow's PSNs before any socket sees it, then passes the frame on;
//! - **the observer's drops**, which the capture socket's kernel counters
//!   report ([`crate::sys::rawsock::PacketSocket::drops`],
//!   PACKET_STATISTICS).
//!
//! A [`LossAccount`] puts them side by side: the switch lost `sent -
//! arrived`; the observer lost `arrived - captured`, and said so itself.
//! Tests fail on the first and only report the second.
//!
//! Adopting it in a lab test: attach a probe to each receiving device
//! before sending (`ArrivalProbe::attach(netns, "eth0")`), read
//! [`ArrivalProbe::totals`] after, and build a [`LossAccount`] with the
//! sender's count and the capture's (or use [`crate::testbed::ecmp_lab`]'s
//! `Capture`, which does all of it).

use std::{collections::BTreeMap, fmt, net::IpAddr};

use anyhow::{Context as _, Result};
use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::XdpMode,
};
use rocev2_common::arrival::{
    names, ArrivalEvent, ArrivalKey, ArrivalTotals, FlowArrival, EVENT_DUPLICATE, EVENT_GAP, EVENT_LATE,
};

use crate::{
    sys::netns::in_netns_scoped,
    tools::programs::{ToolPrograms, XDP_ARRIVAL_DROP_PROGRAM, XDP_ARRIVAL_PROGRAM},
};

/// An arrival probe on one device; detached when dropped.
pub struct ArrivalProbe {
    programs: ToolPrograms,
    netns: String,
    dev: String,
}

impl ArrivalProbe {
    /// Attaches the probe to `dev` in namespace `netns` (native XDP; on a
    /// veth it also gives the device the NAPI that redirected frames need).
    pub fn attach(netns: &str, dev: &str) -> Result<Self> {
        Self::attach_program(netns, dev, XDP_ARRIVAL_PROGRAM)
    }

    /// Like [`ArrivalProbe::attach`], but the probe drops the RoCEv2 frames
    /// after counting them (everything else goes on to the stack, which
    /// still answers ARP and neighbour discovery): for a receiver no
    /// application listens on, whose stack need not answer with ICMP.
    pub fn attach_dropping(netns: &str, dev: &str) -> Result<Self> {
        Self::attach_program(netns, dev, XDP_ARRIVAL_DROP_PROGRAM)
    }

    fn attach_program(netns: &str, dev: &str, program: &str) -> Result<Self> {
        let mut programs = ToolPrograms::load()?;
        in_netns_scoped(netns, || {
            programs
                .xdp(program)?
                .attach(dev, XdpMode::Driver)
                .with_context(|| format!("cannot attach the arrival probe to {dev} in {netns}"))?;
            Ok(())
        })?;
        Ok(Self { programs, netns: netns.to_owned(), dev: dev.to_owned() })
    }

    pub fn place(&self) -> String {
        format!("{}/{}", self.netns, self.dev)
    }

    /// Frames counted so far, summed over CPUs.
    pub fn totals(&self) -> Result<ArrivalTotals> {
        let map: PerCpuArray<&MapData, ArrivalTotals> =
            PerCpuArray::try_from(self.programs.map(names::ARRIVAL_TOTALS)?)?;
        let per_cpu = map.get(&0, 0).context("cannot read ARRIVAL_TOTALS")?;
        Ok(per_cpu.iter().fold(ArrivalTotals::default(), |a, c| ArrivalTotals {
            roce: a.roce + c.roce,
            other: a.other + c.other,
            untracked: a.untracked + c.untracked,
            events_lost: a.events_lost + c.events_lost,
        }))
    }

    /// Every flow followed so far.
    pub fn flows(&self) -> Result<BTreeMap<Flow, FlowArrival>> {
        let map: HashMap<&MapData, ArrivalKey, FlowArrival> =
            HashMap::try_from(self.programs.map(names::ARRIVAL_FLOWS)?)?;
        let mut out = BTreeMap::new();
        for entry in map.iter() {
            let (key, flow) = entry.context("cannot read ARRIVAL_FLOWS")?;
            out.insert(Flow::from(key), flow);
        }
        Ok(out)
    }

    /// The anomalies (gaps, late packets, duplicates) reported since the
    /// last call, oldest first.
    pub fn drain_events(&mut self) -> Result<Vec<SeqEvent>> {
        let mut ring: RingBuf<&mut MapData> = RingBuf::try_from(self.programs.map_mut(names::ARRIVAL_EVENTS)?)?;
        let mut out = Vec::new();
        while let Some(item) = ring.next() {
            if item.len() >= std::mem::size_of::<ArrivalEvent>() {
                // SAFETY: the program writes whole ArrivalEvents; read unaligned.
                let e: ArrivalEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                out.push(SeqEvent::from(e));
            }
        }
        Ok(out)
    }
}

/// A flow as people read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Flow {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub dest_qp: u32,
}

/// An address from the words the probe keys flows by (those of
/// rocev2_common::hash::ipv4_words / ipv6_words: bytes in memory order).
fn address(words: [u32; 4], family: u32) -> IpAddr {
    if family == 4 {
        IpAddr::from(words[0].to_le_bytes())
    } else {
        let mut b = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        IpAddr::from(b)
    }
}

impl From<ArrivalKey> for Flow {
    fn from(k: ArrivalKey) -> Self {
        Self { src: address(k.src, k.family), dst: address(k.dst, k.family), dest_qp: k.dest_qp }
    }
}

impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {} QP {:#x}", self.src, self.dst, self.dest_qp)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqKind {
    /// `count` PSNs before `psn` were skipped.
    Gap,
    Late,
    Duplicate,
}

/// One anomaly the probe saw, at `time_ns` (CLOCK_MONOTONIC).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqEvent {
    pub flow: Flow,
    pub kind: SeqKind,
    pub psn: u32,
    pub count: u32,
    pub time_ns: u64,
}

impl From<ArrivalEvent> for SeqEvent {
    fn from(e: ArrivalEvent) -> Self {
        let kind = match e.kind {
            EVENT_GAP => SeqKind::Gap,
            EVENT_LATE => SeqKind::Late,
            EVENT_DUPLICATE => SeqKind::Duplicate,
            _ => SeqKind::Duplicate,
        };
        Self { flow: e.key.into(), kind, psn: e.psn, count: e.count, time_ns: e.time_ns }
    }
}

/// CLOCK_MONOTONIC now, in ns: the clock the probe stamps events with.
pub fn monotonic_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// Sent, arrived (counted where the frames land) and captured (by an
/// observer that may drop), with the observer's own drop count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LossAccount {
    pub sent: u64,
    pub arrived: u64,
    pub captured: u64,
    /// What the capture sockets said they dropped (PACKET_STATISTICS).
    pub observer_dropped: u64,
}

impl LossAccount {
    /// Frames the network (the switch) lost: sent, never arrived.
    pub fn switch_lost(&self) -> u64 {
        self.sent.saturating_sub(self.arrived)
    }

    /// Frames that arrived but the capture did not see.
    pub fn observer_lost(&self) -> u64 {
        self.arrived.saturating_sub(self.captured)
    }

    /// One sentence with every number.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "sent {}, arrived {} (counted by XDP where the frames land), captured {}",
            self.sent, self.arrived, self.captured
        );
        if self.switch_lost() > 0 {
            s.push_str(&format!("; the switch LOST {}", self.switch_lost()));
        } else if self.arrived > self.sent {
            s.push_str(&format!("; {} MORE arrived than were sent", self.arrived - self.sent));
        } else {
            s.push_str("; the switch lost none");
        }
        if self.observer_lost() > 0 || self.observer_dropped > 0 {
            s.push_str(&format!(
                "; the observer lost {} that arrived (its sockets counted {} drops): not the switch's loss",
                self.observer_lost(),
                self.observer_dropped
            ));
        }
        s
    }

    /// Ok when every frame sent arrived exactly once; the observer's loss
    /// does not count against the switch.
    pub fn check(&self) -> Result<(), String> {
        if self.sent == 0 {
            return Err("nothing was sent".into());
        }
        if self.switch_lost() > 0 || self.arrived > self.sent {
            return Err(self.describe());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_read_back_the_addresses_the_probe_keyed_them_by() {
        use rocev2_common::hash::{ipv4_words, ipv6_words};
        let v4: std::net::Ipv4Addr = "10.1.2.3".parse().unwrap();
        let v6: std::net::Ipv6Addr = "fd00:1:2::3".parse().unwrap();
        let key = ArrivalKey { src: ipv4_words(v4.octets()), dst: ipv4_words([10, 9, 8, 7]), dest_qp: 5, family: 4 };
        assert_eq!(Flow::from(key).to_string(), "10.1.2.3 -> 10.9.8.7 QP 0x5");
        let key = ArrivalKey { src: ipv6_words(&v6.octets()), dst: ipv6_words(&v6.octets()), dest_qp: 1, family: 6 };
        assert_eq!(Flow::from(key).src, IpAddr::from(v6));
    }

    #[test]
    fn the_switch_is_blamed_only_for_frames_that_never_arrived() {
        let observer = LossAccount { sent: 100, arrived: 100, captured: 90, observer_dropped: 12 };
        assert!(observer.check().is_ok());
        assert_eq!((observer.switch_lost(), observer.observer_lost()), (0, 10));
        assert_eq!(
            observer.describe(),
            "sent 100, arrived 100 (counted by XDP where the frames land), captured 90; the switch lost none; the observer lost 10 that arrived (its sockets counted 12 drops): not the switch's loss"
        );
        let switch = LossAccount { sent: 100, arrived: 97, captured: 97, observer_dropped: 0 };
        assert_eq!(
            switch.check().unwrap_err(),
            "sent 100, arrived 97 (counted by XDP where the frames land), captured 97; the switch LOST 3"
        );
        let duplicated = LossAccount { sent: 100, arrived: 101, captured: 101, observer_dropped: 0 };
        assert!(duplicated.check().unwrap_err().contains("1 MORE arrived than were sent"));
        assert!(LossAccount::default().check().is_err());
    }
}
