//! ECN marking against a virtual (phantom) queue per egress port.
//!
//! Each forwarded packet adds its bytes to its egress port's virtual queue,
//! which drains at the configured port rate. Between `kmin` and `kmax` bytes
//! an ECT packet is marked CE with a probability rising linearly to `pmax`;
//! above `kmax` every ECT packet is marked (the WRED/ECN shape of SONiC and
//! Cumulus profiles). The queue only exists in these numbers: it sees the
//! load the port will get, before a real queue builds.

use crate::{
    class::{ClassAction, CLASS_ECN_EXEMPT, CLASS_ECN_PROFILE},
    counters::{EgressCounter, EgressCounters},
};

/// ECN codepoints (the low two bits of the IPv4 TOS / IPv6 traffic class).
pub const NOT_ECT: u8 = 0b00;
pub const ECT1: u8 = 0b01;
pub const ECT0: u8 = 0b10;
pub const CE: u8 = 0b11;

/// Profile flag: drop Not-ECT packets above `kmax` instead of only counting.
pub const PROFILE_DROP_NOT_ECT: u32 = 1;

/// A marking profile. `pmax` is a probability scaled to `u32::MAX` = 1.0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EcnProfile {
    pub kmin_bytes: u64,
    pub kmax_bytes: u64,
    pub pmax_scaled: u32,
    pub flags: u32,
}

/// State of one egress port's virtual queue (shared by all CPUs; updates
/// are plain read-modify-write, so concurrent CPUs can lose a packet's bytes
/// now and then: the depth is a slight underestimate under contention).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtualQueue {
    pub depth_bytes: u64,
    pub last_update_ns: u64,
    /// Highest depth seen since start.
    pub high_water_bytes: u64,
}

/// Value of the EGRESS map, keyed by egress ifindex.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EgressEntry {
    /// Index into VQUEUES and EGRESS_COUNTERS.
    pub slot: u32,
    /// ECN profile for packets whose class names none; u32::MAX = no marking.
    pub profile: u32,
    /// The port rate the virtual queue drains at.
    pub drain: DrainRate,
}

impl EgressEntry {
    pub fn new(slot: u32, profile: u32, rate_bytes_per_sec: u64) -> Self {
        Self { slot, profile, drain: DrainRate::new(rate_bytes_per_sec) }
    }
}

/// A port rate prepared for the per-packet drain: `elapsed_ns * mult >>
/// shift` bytes, a multiply and a shift instead of [`drained_bytes`]'s six
/// 64-bit divisions (tens of ns per packet in eBPF). `mult` stays below
/// 2^24 so the product cannot overflow for gaps below [`FAST_DRAIN_NS`],
/// and the shift is as large as that allows, so the result is within
/// 1/2^23 (0.12 ppm) plus one byte of the exact value, never above it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainRate {
    pub rate_bytes_per_sec: u64,
    pub mult: u64,
    pub shift: u32,
    pub _pad: u32,
}

/// Gaps up to this long (about 18 minutes) take the fast path.
pub const FAST_DRAIN_NS: u64 = 1 << 40;
const MULT_LIMIT: u64 = 1 << 24;

impl DrainRate {
    /// Computed once per port by the control program (128-bit arithmetic
    /// is fine there, never in the eBPF program).
    /// A const fn: the bench's primitive (the tools object) takes its rate
    /// from a constant, computed by the compiler.
    pub const fn new(rate_bytes_per_sec: u64) -> Self {
        let rate =
            if rate_bytes_per_sec < MAX_RATE_BYTES_PER_SEC { rate_bytes_per_sec } else { MAX_RATE_BYTES_PER_SEC };
        const fn mult_at(rate: u64, shift: u32) -> u128 {
            ((rate as u128) << shift) / NS_PER_SEC as u128
        }
        let mut shift = 63;
        while shift > 0 && mult_at(rate, shift) >= MULT_LIMIT as u128 {
            shift -= 1;
        }
        Self { rate_bytes_per_sec: rate, mult: mult_at(rate, shift) as u64, shift, _pad: 0 }
    }

    /// Bytes sent in `elapsed_ns`; the exact (slow) arithmetic only for
    /// gaps too long for the multiplier.
    #[inline(always)]
    pub fn drained(&self, elapsed_ns: u64) -> u64 {
        if elapsed_ns < FAST_DRAIN_NS {
            (elapsed_ns * (self.mult & (MULT_LIMIT - 1))) >> (self.shift & 63)
        } else {
            drained_bytes(elapsed_ns, self.rate_bytes_per_sec)
        }
    }
}

pub const NO_PROFILE: u32 = u32::MAX;

const _: () = {
    assert!(core::mem::size_of::<EcnProfile>() == 24);
    assert!(core::mem::size_of::<VirtualQueue>() == 24);
    assert!(core::mem::size_of::<EgressEntry>() == 32);
};

#[cfg(feature = "user")]
mod pod {
    unsafe impl aya::Pod for super::EcnProfile {}
    unsafe impl aya::Pod for super::VirtualQueue {}
    unsafe impl aya::Pod for super::EgressEntry {}
}

/// Highest port rate the arithmetic below handles exactly (1 TiB/s).
pub const MAX_RATE_BYTES_PER_SEC: u64 = (1 << 40) - 1;
const NS_PER_SEC: u64 = 1_000_000_000;

/// Bytes a port at `rate_bytes_per_sec` sends in `elapsed_ns` (to within
/// two bytes). Only 64-bit multiplies: the BPF target has no 128-bit ones.
#[inline(always)]
pub fn drained_bytes(elapsed_ns: u64, rate_bytes_per_sec: u64) -> u64 {
    let rate = if rate_bytes_per_sec > MAX_RATE_BYTES_PER_SEC { MAX_RATE_BYTES_PER_SEC } else { rate_bytes_per_sec };
    // Whole seconds: after a million idle seconds every queue is empty anyway.
    let secs = elapsed_ns / NS_PER_SEC;
    if secs >= 1 << 20 {
        return u64::MAX;
    }
    let rem = elapsed_ns % NS_PER_SEC; // < 2^30
                                       // rate = hi * 2^20 + lo, so rem * hi and rem * lo each stay below 2^50.
    let (hi, lo) = (rate >> 20, rate & ((1 << 20) - 1));
    let a = rem * hi;
    let from_hi = ((a / NS_PER_SEC) << 20) + (((a % NS_PER_SEC) << 20) / NS_PER_SEC);
    let from_lo = rem * lo / NS_PER_SEC;
    secs * rate + from_hi + from_lo
}

/// The queue after draining up to `now_ns` and adding a packet of `len`.
#[inline(always)]
pub fn enqueue(q: &VirtualQueue, now_ns: u64, len: u64, drain: &DrainRate) -> VirtualQueue {
    let elapsed = now_ns.saturating_sub(q.last_update_ns);
    let depth = q.depth_bytes.saturating_sub(drain.drained(elapsed)) + len;
    VirtualQueue {
        depth_bytes: depth,
        last_update_ns: if now_ns > q.last_update_ns { now_ns } else { q.last_update_ns },
        high_water_bytes: if depth > q.high_water_bytes { depth } else { q.high_water_bytes },
    }
}

/// Why the marker refuses a packet: a Not-ECT packet above `kmax` on a
/// profile with [`PROFILE_DROP_NOT_ECT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropNotEct;

/// Where a packet's marking finds its egress port's state: the maps in the
/// pipeline (rocev2-ebpf's ecn.rs), copies in one value in the bench's
/// primitive (the tools object), so both run [`mark_on`].
///
/// # Safety
/// The pointers returned are valid for the program run, and the counter
/// block is this CPU's (written without atomics).
pub unsafe trait PortState {
    /// The port's egress counter block on this CPU.
    fn counters(&self, slot: u32) -> Option<*mut EgressCounters>;
    /// The port's virtual queue.
    fn queue(&self, slot: u32) -> Option<*mut VirtualQueue>;
    /// A marking profile.
    fn profile(&self, id: u32) -> Option<&EcnProfile>;
    /// The precise clock, for a packet whose pipeline took no reading yet.
    fn now(&self) -> u64;
    /// A uniformly random number, drawn only between the thresholds.
    fn random(&self) -> u32;
}

/// The port's egress counters on this CPU, found once per packet. Its adds
/// are written here rather than by [`EgressCounters::add`]: the line
/// profile files a line by its source file, and these are the marker's.
struct Tally(Option<*mut EgressCounters>);

impl Tally {
    #[inline(always)]
    fn add(&mut self, counter: EgressCounter, value: u64) {
        if let Some(block) = self.0 {
            // SAFETY: this CPU's block (PortState's contract).
            unsafe { (*block).counts[counter as usize] += value };
        }
    }
}

/// One packet of `len` bytes through its egress port's virtual queue:
/// counted, the queue drained to `now` (the packet's clock reading, 0 if
/// none was taken yet) and the packet added, then marked by the class's
/// or the port's profile. Returns the TOS/traffic-class byte to send (CE
/// set when marked), or the drop of a Not-ECT packet the profile asks for.
/// The pipeline's marker and the bench's primitive of it.
#[inline(always)]
pub fn mark_on<S: PortState>(
    state: &S,
    egress: &EgressEntry,
    tos: u8,
    len: u64,
    class: &ClassAction,
    now: u64,
) -> Result<u8, DropNotEct> {
    let egress = *egress;
    let mut tally = Tally(state.counters(egress.slot));
    tally.add(EgressCounter::TxPackets, 1);
    tally.add(EgressCounter::TxBytes, len);
    let Some(q) = state.queue(egress.slot) else { return Ok(tos) };
    // Read the clock once per packet: the flowlet choice may have already.
    let now = if now == 0 { state.now() } else { now };
    // SAFETY: a valid queue (PortState's contract); concurrent CPUs may
    // race (see VirtualQueue).
    let depth = unsafe {
        let next = enqueue(&*q, now, len, &egress.drain);
        *q = next;
        next.depth_bytes
    };
    if class.flags & CLASS_ECN_EXEMPT != 0 {
        tally.add(EgressCounter::Exempt, 1);
        return Ok(tos);
    }
    let profile_id = if class.flags & CLASS_ECN_PROFILE != 0 { class.profile } else { egress.profile };
    if profile_id == NO_PROFILE {
        return Ok(tos);
    }
    let Some(profile) = state.profile(profile_id) else { return Ok(tos) };
    let congestion = congestion(depth, profile);
    if is_ect(tos) {
        tally.add(EgressCounter::EctSeen, 1);
        // A random number only where the probability needs one (a helper
        // call per packet otherwise).
        let random = match congestion {
            Congestion::Probabilistic(_) => state.random(),
            _ => 0,
        };
        if should_mark(congestion, random) {
            tally.add(EgressCounter::Marked, 1);
            return Ok(with_ce(tos));
        }
    } else if tos & 3 == NOT_ECT && congestion != Congestion::None {
        tally.add(EgressCounter::NotEctOverThreshold, 1);
        if congestion == Congestion::Full && profile.flags & PROFILE_DROP_NOT_ECT != 0 {
            return Err(DropNotEct);
        }
    }
    Ok(tos)
}

/// Where a depth falls against a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Congestion {
    /// Below kmin: never mark.
    None,
    /// Between kmin and kmax: mark with this probability (scaled to u32::MAX).
    Probabilistic(u32),
    /// Above kmax: mark every ECT packet.
    Full,
}

#[inline(always)]
pub fn congestion(depth: u64, p: &EcnProfile) -> Congestion {
    if depth <= p.kmin_bytes {
        Congestion::None
    } else if depth >= p.kmax_bytes {
        Congestion::Full
    } else {
        // span > 0 here because kmin < depth < kmax. The position within the
        // span is taken to 1/65536 so the products fit in 64 bits.
        let (mut above, mut span) = (depth - p.kmin_bytes, p.kmax_bytes - p.kmin_bytes);
        if span >= 1 << 32 {
            above >>= 16;
            span >>= 16;
        }
        let fraction = (above << 16) / span.max(1); // 0..65536
        Congestion::Probabilistic(((fraction * u64::from(p.pmax_scaled)) >> 16) as u32)
    }
}

/// Whether to mark, given a uniformly random `random` (bpf_get_prandom_u32).
#[inline(always)]
pub fn should_mark(c: Congestion, random: u32) -> bool {
    match c {
        Congestion::None => false,
        Congestion::Probabilistic(p) => random < p,
        Congestion::Full => true,
    }
}

/// New IPv4 TOS byte / IPv6 traffic class with ECN set to CE.
#[inline(always)]
pub fn with_ce(tos: u8) -> u8 {
    tos | CE
}

#[inline(always)]
pub fn is_ect(tos: u8) -> bool {
    let ecn = tos & 0b11;
    ecn == ECT0 || ecn == ECT1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> EcnProfile {
        // SONiC lossless defaults: 1 MiB, 2 MiB, 5%.
        EcnProfile { kmin_bytes: 1 << 20, kmax_bytes: 2 << 20, pmax_scaled: (u32::MAX / 100) * 5, flags: 0 }
    }

    #[test]
    fn queue_drains_at_the_port_rate() {
        let q = VirtualQueue { depth_bytes: 10_000, last_update_ns: 1_000, high_water_bytes: 10_000 };
        // 1 GB/s drains 1 byte per ns: 4_000 ns later 4_000 bytes are gone.
        let q2 = enqueue(&q, 5_000, 100, &DrainRate::new(1_000_000_000));
        // drained_bytes is exact to within two bytes.
        assert!((6_100..=6_102).contains(&q2.depth_bytes), "{}", q2.depth_bytes);
        assert_eq!(q2.high_water_bytes, 10_000);
        // Long idle empties it completely.
        assert_eq!(enqueue(&q2, 10_000_000_000, 64, &DrainRate::new(1_000_000_000)).depth_bytes, 64);
    }

    #[test]
    fn drain_does_not_overflow_for_long_gaps() {
        assert_eq!(drained_bytes(u64::MAX, 50_000_000_000), u64::MAX);
        assert_eq!(drained_bytes(1_500_000_000, 1_000), 1_500);
    }

    #[test]
    fn drain_is_exact_to_two_bytes() {
        for rate in [1u64, 1_000, 125_000_000, 3_125_000_000, 50_000_000_000, MAX_RATE_BYTES_PER_SEC] {
            for ns in [0u64, 1, 999, 123_456, 999_999_999, 1_000_000_001, 7_777_777_777] {
                let exact = (u128::from(ns) * u128::from(rate) / 1_000_000_000) as u64;
                let got = drained_bytes(ns, rate);
                assert!(got <= exact && exact - got <= 2, "rate {rate} ns {ns}: {got} vs {exact}");
            }
        }
    }

    #[test]
    fn marking_rises_linearly_between_kmin_and_kmax() {
        let p = profile();
        assert_eq!(congestion(1 << 20, &p), Congestion::None);
        assert_eq!(congestion(2 << 20, &p), Congestion::Full);
        let Congestion::Probabilistic(mid) = congestion(3 << 19, &p) else { panic!() };
        let expected = p.pmax_scaled / 2;
        assert!(mid.abs_diff(expected) <= expected / 1000, "{mid} vs {expected}");
        assert!(!should_mark(Congestion::Probabilistic(mid), mid));
        assert!(should_mark(Congestion::Probabilistic(mid), mid - 1));
    }

    /// One port's state in memory, as the bench's primitive keeps it.
    struct Port {
        counters: core::cell::UnsafeCell<EgressCounters>,
        queue: core::cell::UnsafeCell<VirtualQueue>,
        profile: EcnProfile,
    }

    // SAFETY: the test's own memory, one thread.
    unsafe impl PortState for Port {
        fn counters(&self, _slot: u32) -> Option<*mut EgressCounters> {
            Some(self.counters.get())
        }
        fn queue(&self, _slot: u32) -> Option<*mut VirtualQueue> {
            Some(self.queue.get())
        }
        fn profile(&self, id: u32) -> Option<&EcnProfile> {
            (id == 0).then_some(&self.profile)
        }
        fn now(&self) -> u64 {
            7
        }
        fn random(&self) -> u32 {
            0
        }
    }

    #[test]
    fn the_marker_counts_drains_and_marks() {
        let port = Port { counters: Default::default(), queue: Default::default(), profile: profile() };
        let egress = EgressEntry::new(0, 0, 1_000_000_000); // a byte per ns
        let none = ClassAction { profile: NO_PROFILE, ..ClassAction::default() };
        // Below kmin: sent as it came; the clock read when the packet has none.
        assert_eq!(mark_on(&port, &egress, ECT0, 1_000, &none, 0), Ok(ECT0));
        assert_eq!(unsafe { *port.queue.get() }.last_update_ns, 7);
        // 3 MiB at once: above kmax, so CE (random 0 would mark between them too).
        assert_eq!(mark_on(&port, &egress, ECT0, 3 << 20, &none, 7), Ok(CE));
        assert_eq!(mark_on(&port, &egress, NOT_ECT, 100, &none, 7), Ok(NOT_ECT));
        let drop_not_ect = EcnProfile { flags: PROFILE_DROP_NOT_ECT, ..profile() };
        let strict = Port { profile: drop_not_ect, ..port };
        assert_eq!(mark_on(&strict, &egress, NOT_ECT, 100, &none, 7), Err(DropNotEct));
        // An exempt class is queued and counted, never marked.
        let exempt = ClassAction { flags: CLASS_ECN_EXEMPT, ..none };
        assert_eq!(mark_on(&strict, &egress, ECT0, 100, &exempt, 7), Ok(ECT0));
        let port = strict;
        let count = |c: EgressCounter| unsafe { (*port.counters.get()).get(c) };
        assert_eq!(count(EgressCounter::TxPackets), 5);
        assert_eq!(count(EgressCounter::TxBytes), 1_000 + (3 << 20) + 300);
        assert_eq!(count(EgressCounter::EctSeen), 2);
        assert_eq!(count(EgressCounter::Marked), 1);
        assert_eq!(count(EgressCounter::NotEctOverThreshold), 2);
        assert_eq!(count(EgressCounter::Exempt), 1);
        // 10 ms later, at a byte per ns, the queue is empty again.
        assert_eq!(mark_on(&port, &egress, ECT0, 64, &none, 10_000_007), Ok(ECT0));
        assert_eq!(unsafe { *port.queue.get() }.depth_bytes, 64);
    }

    #[test]
    fn only_ect_codepoints_are_markable() {
        assert!(is_ect(ECT0) && is_ect(ECT1 | 0x68));
        assert!(!is_ect(NOT_ECT) && !is_ect(CE));
        assert_eq!(with_ce(0x68 | ECT0), 0x6B);
    }
}
