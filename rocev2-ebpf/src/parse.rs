//! Header parsing with bounds checks the verifier can follow.
//!
//! Each parser returns the data the next stage needs, or an [`Outcome`]
//! naming why the packet leaves the fast path (to the kernel or dropped).

use core::mem::size_of;

use crate::ctx::PacketBuf;
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
    udp::UdpHdr,
    vlan::VlanHdr,
};
use rocev2_common::{
    bth::{self, BTH_LEN, ROCEV2_UDP_PORT},
    checksum,
    counters::PortCounter,
};

const ETH_P_IPV4: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
/// Smallest TCP header: the ports are all we read, but a shorter one is broken.
const TCP_MIN_LEN: usize = 20;

/// What happens to a packet that leaves the fast path.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Hand it to the kernel stack.
    Pass,
    Drop,
}

/// Why a packet leaves the fast path: the verdict and the counter that
/// records the reason. Each program type maps the verdict to its action.
#[derive(Clone, Copy)]
pub struct Outcome {
    pub verdict: Verdict,
    pub counter: PortCounter,
}

impl Outcome {
    /// As a u32 for returning from a BPF subprogram: bit 31 set for a
    /// drop, the counter index below.
    #[inline(always)]
    pub fn encode(self) -> u32 {
        let drop = if self.verdict == Verdict::Drop { 1 << 31 } else { 0 };
        drop | self.counter as u32
    }

    #[inline(always)]
    pub fn decode(code: u32) -> Self {
        let index = code & 0xFFFF;
        // Fall back to a named counter should a code ever be out of range.
        let counter =
            if index < PortCounter::COUNT { PortCounter::ALL[index as usize] } else { PortCounter::DropBadIpHeader };
        let verdict = if code >> 31 == 1 { Verdict::Drop } else { Verdict::Pass };
        Outcome { verdict, counter }
    }
}

#[inline(always)]
pub const fn pass(counter: PortCounter) -> Outcome {
    Outcome { verdict: Verdict::Pass, counter }
}

#[inline(always)]
pub const fn drop(counter: PortCounter) -> Outcome {
    Outcome { verdict: Verdict::Drop, counter }
}

/// Pointer to a `T` at `offset` if the whole `T` lies inside the packet.
#[inline(always)]
pub fn ptr_at<T, C: PacketBuf>(ctx: &C, offset: usize) -> Option<*mut T> {
    let start = ctx.data();
    // Opaque to LLVM so it cannot rewrite the check below into length
    // arithmetic (end - start), which the verifier cannot follow.
    let end = core::hint::black_box(ctx.data_end());
    if start + offset + size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

/// Length of the whole frame (a helper call in XDP), for frames the IP
/// parsers did not measure. IP lengths are checked against the whole
/// frame, not against the linear part: a jumbo frame's payload may sit in
/// fragments (headers are always in the linear part, where ptr_at reads
/// them).
#[inline(always)]
pub fn frame_len<C: PacketBuf>(ctx: &C) -> usize {
    ctx.total_len()
}

pub enum L3Kind {
    V4,
    V6,
}

pub struct L2 {
    pub l3_off: usize,
    pub kind: L3Kind,
}

/// Ethernet with at most one 802.1Q/802.1ad tag. The tag is carried
/// through unchanged.
#[inline(always)]
pub fn parse_l2<C: PacketBuf>(ctx: &C) -> Result<L2, Outcome> {
    let eth: *mut EthHdr = ptr_at(ctx, 0).ok_or(drop(PortCounter::DropRunt))?;
    // SAFETY: bounds checked by ptr_at.
    let (dst0, mut ether_type) = unsafe { ((*eth).dst_addr[0], u16::from_be((*eth).ether_type)) };
    // Group bit set: multicast or broadcast, never routed here.
    if dst0 & 1 != 0 {
        return Err(pass(PortCounter::PassL2Multicast));
    }
    let mut l3_off = EthHdr::LEN;
    if ether_type == ETH_P_8021Q || ether_type == ETH_P_8021AD {
        let vlan: *const VlanHdr = ptr_at(ctx, l3_off).ok_or(drop(PortCounter::DropRunt))?;
        // SAFETY: bounds checked.
        ether_type = u16::from_be(unsafe { (*vlan).ether_type });
        l3_off += VlanHdr::LEN;
        if ether_type == ETH_P_8021Q || ether_type == ETH_P_8021AD {
            return Err(pass(PortCounter::PassStackedVlan));
        }
    }
    let kind = match ether_type {
        ETH_P_IPV4 => L3Kind::V4,
        ETH_P_IPV6 => L3Kind::V6,
        _ => return Err(pass(PortCounter::PassNotIp)),
    };
    Ok(L2 { l3_off, kind })
}

/// A checked IPv4 header, where its payload lies and the frame's length.
pub struct Ipv4 {
    pub hdr: *mut Ipv4Hdr,
    pub l4_off: usize,
    pub l4_end: usize,
    pub frame_len: usize,
}

/// IPv4 header of any length (options allowed). Headers the kernel would
/// reject are dropped here; lengths are checked against the frame so later
/// reads cannot run past the IP packet. The frame's length is measured
/// here ([`PacketBuf::len_covering`]) and returned for the counters.
#[inline(always)]
pub fn parse_ipv4<C: PacketBuf>(ctx: &C, l3_off: usize) -> Result<Ipv4, Outcome> {
    let bad = drop(PortCounter::DropBadIpHeader);
    let hdr: *mut Ipv4Hdr = ptr_at(ctx, l3_off).ok_or(bad)?;
    // SAFETY: bounds checked.
    let (vihl, total_len) = unsafe { ((*hdr).vihl, u16::from_be_bytes((*hdr).tot_len) as usize) };
    let header_len = ((vihl & 0x0F) as usize) * 4;
    if vihl >> 4 != 4 || header_len < Ipv4Hdr::LEN {
        return Err(bad);
    }
    let frame_len = ctx.len_covering(l3_off + total_len);
    if total_len < header_len || l3_off + total_len > frame_len {
        return Err(bad);
    }
    Ok(Ipv4 { hdr, l4_off: l3_off + header_len, l4_end: l3_off + total_len, frame_len })
}

/// True if the 20-byte IPv4 header's checksum is right (a header with
/// options never gets here: it goes to the kernel). Words are summed as
/// read (native order): a right header folds to 0xFFFF in either byte
/// order. `l3_off` is even (14 or 18), so the u16 reads are aligned.
#[inline(always)]
pub fn ipv4_checksum_ok(hdr: *const Ipv4Hdr) -> bool {
    // SAFETY: parse_ipv4 checked the 20-byte header lies in the packet.
    // Aligned while packet data starts at an even address (drivers and
    // veth do; only an odd bpf_xdp_adjust_head by an earlier program would
    // break it, and BPF loads on x86 do not fault even then).
    let words = unsafe { core::ptr::read(hdr as *const [u16; Ipv4Hdr::LEN / 2]) };
    let mut sum = 0u32;
    for word in words {
        sum += u32::from(word);
    }
    checksum::fold(sum) == 0xFFFF
}

/// The fields of an IPv4 header the IPv4 pipeline uses, each read once.
#[derive(Clone, Copy)]
pub struct Ipv4Fields {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub ttl: u8,
    pub protocol: u8,
    pub tos: u8,
}

/// Reads [`Ipv4Fields`] (the pipeline's, and the bench's primitive of its
/// header tests).
///
/// # Safety
/// `hdr` must be a header [`parse_ipv4`] checked.
#[inline(always)]
pub unsafe fn ipv4_fields(hdr: *const Ipv4Hdr) -> Ipv4Fields {
    // SAFETY: the caller's.
    unsafe {
        Ipv4Fields {
            src: (*hdr).src_addr,
            dst: (*hdr).dst_addr,
            ttl: (*hdr).ttl,
            protocol: (*hdr).proto,
            tos: (*hdr).tos,
        }
    }
}

/// The tests after the fragment test that hand a routed IPv4 packet to
/// the kernel: its TTL expires here, or it has options (Record Route,
/// Timestamp, Router Alert need processing the kernel does; RoCE NICs
/// never send them): the header does not end where a 20-byte one would.
#[inline(always)]
pub fn ipv4_ttl_and_options(ttl: u8, l3_off: usize, l4_off: usize) -> Result<(), Outcome> {
    if ttl <= 1 {
        return Err(pass(PortCounter::PassTtlExpired));
    }
    if l4_off != l3_off + Ipv4Hdr::LEN {
        return Err(pass(PortCounter::PassIpv4Options));
    }
    Ok(())
}

/// True for IPv4 fragments: more-fragments set or a non-zero offset.
#[inline(always)]
pub fn is_fragment(hdr: *const Ipv4Hdr) -> bool {
    // SAFETY: caller passes a checked header.
    let frags = u16::from_be_bytes(unsafe { (*hdr).frags });
    frags & 0x3FFF != 0
}

pub struct Ipv6 {
    pub hdr: *mut Ipv6Hdr,
    pub l4_off: usize,
    pub l4_end: usize,
    pub frame_len: usize,
}

/// The IPv6 header, checked like [`parse_ipv4`]'s.
#[inline(always)]
pub fn parse_ipv6<C: PacketBuf>(ctx: &C, l3_off: usize) -> Result<Ipv6, Outcome> {
    let bad = drop(PortCounter::DropBadIpHeader);
    let hdr: *mut Ipv6Hdr = ptr_at(ctx, l3_off).ok_or(bad)?;
    // SAFETY: bounds checked.
    let (version, payload_len) = unsafe { ((*hdr).vcf[0] >> 4, u16::from_be_bytes((*hdr).payload_len) as usize) };
    let l4_off = l3_off + Ipv6Hdr::LEN;
    let frame_len = ctx.len_covering(l4_off + payload_len);
    if version != 6 || l4_off + payload_len > frame_len {
        return Err(bad);
    }
    Ok(Ipv6 { hdr, l4_off, l4_end: l4_off + payload_len, frame_len })
}

/// Next-header values that are IPv6 extension headers. Packets carrying them
/// go to the kernel, which walks the chain.
#[inline(always)]
pub fn is_ipv6_extension(next_header: u8) -> bool {
    matches!(next_header, 0 | 43 | 44 | 51 | 60 | 135 | 139 | 140 | 253 | 254)
}

/// What the flow hash needs from the transport header.
pub struct L4 {
    pub src_port: u16,
    pub dst_port: u16,
    pub roce: Roce,
    /// The BTH DestQP (24 bits) of a RoCEv2 packet, else 0. Not in
    /// [`Roce`]: a flow key built from an enum payload let LLVM compute on
    /// an undefined register for the other variants, which the verifier
    /// rejects when that register happens to hold a pointer.
    pub dest_qp: u32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Roce {
    /// Not UDP 4791.
    No,
    /// RoCEv2 with a whole BTH, which starts at `bth_off` (never beyond
    /// byte 255: Ethernet, VLAN, IPv4 with options, UDP), so telemetry
    /// reads it without parsing the frame again. `payload_len` counts the
    /// bytes after the BTH (extension headers included) before pad and ICRC.
    Yes { opcode: u8, bth_off: u8, payload_len: u32 },
    /// UDP 4791 whose payload is shorter than a BTH.
    ShortBth,
}

/// Ports of TCP/UDP (0/0 for other protocols) and, for RoCEv2, the BTH.
/// `l4_end` is where the IP packet ends (Ethernet padding excluded).
#[inline(always)]
pub fn parse_l4<C: PacketBuf>(ctx: &C, protocol: u8, l4_off: usize, l4_end: usize) -> Result<L4, Outcome> {
    let truncated = pass(PortCounter::PassL4Truncated);
    match protocol {
        IPPROTO_UDP => {
            if l4_off + UdpHdr::LEN > l4_end {
                return Err(truncated);
            }
            let udp: *const UdpHdr = ptr_at(ctx, l4_off).ok_or(truncated)?;
            // SAFETY: bounds checked.
            let (src_port, dst_port) = unsafe { (u16::from_be_bytes((*udp).src), u16::from_be_bytes((*udp).dst)) };
            let mut roce = Roce::No;
            let mut qp = 0;
            if dst_port == ROCEV2_UDP_PORT {
                let bth_off = l4_off + UdpHdr::LEN;
                roce = Roce::ShortBth;
                if bth_off + BTH_LEN <= l4_end {
                    if let Some(b) = ptr_at::<[u8; BTH_LEN], C>(ctx, bth_off) {
                        // SAFETY: bounds checked.
                        let b = unsafe { &*b };
                        let pad = ((b[1] >> 4) & 3) as usize;
                        let after_bth = l4_end - (bth_off + BTH_LEN);
                        let payload_len = after_bth.saturating_sub(bth::ICRC_LEN + pad) as u32;
                        qp = bth::dest_qp(b);
                        roce = Roce::Yes { opcode: b[0], bth_off: bth_off as u8, payload_len };
                    }
                }
            }
            Ok(L4 { src_port, dst_port, roce, dest_qp: qp })
        }
        IPPROTO_TCP => {
            if l4_off + TCP_MIN_LEN > l4_end {
                return Err(truncated);
            }
            // Source and destination port are the first four bytes, as in UDP.
            let ports: *const [u8; 4] = ptr_at(ctx, l4_off).ok_or(truncated)?;
            // SAFETY: bounds checked.
            let p = unsafe { *ports };
            Ok(L4 {
                src_port: u16::from_be_bytes([p[0], p[1]]),
                dst_port: u16::from_be_bytes([p[2], p[3]]),
                roce: Roce::No,
                dest_qp: 0,
            })
        }
        _ => Ok(L4 { src_port: 0, dst_port: 0, roce: Roce::No, dest_qp: 0 }),
    }
}
