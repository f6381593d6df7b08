//! Finds the BTH of a RoCEv2 frame, for the programs that look at
//! transport state after (or instead of) forwarding: telemetry and the lab's
//! fault injector. The forwarding path keeps its own parse; this one runs
//! only when those features are on.

use network_types::udp::UdpHdr;
use rocev2_common::{
    bth::{aeth, Bth, BTH_LEN, ROCEV2_UDP_PORT},
    hash::{ipv4_words, ipv6_words},
};

use crate::{
    ctx::PacketBuf,
    parse::{self, ptr_at, L3Kind, IPPROTO_UDP},
};

/// Where a RoCEv2 frame's BTH is, and the addresses around it.
pub struct RoceAt {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// 4 or 6.
    pub family: u32,
    pub src_port: u16,
    /// The IP ECN codepoint (3 = CE).
    pub ecn: u8,
    /// DSCP << 2 | ECN.
    pub tos: u8,
    pub bth_off: usize,
    pub bth: Bth,
}

/// [`locate`] into `out` (e.g. per-CPU scratch, off the BPF stack); false
/// if the frame is not RoCEv2.
#[inline(always)]
pub fn locate_into<C: PacketBuf>(ctx: &C, out: &mut RoceAt) -> bool {
    match locate(ctx) {
        Some(at) => {
            *out = at;
            true
        }
        None => false,
    }
}

#[inline(always)]
pub fn locate<C: PacketBuf>(ctx: &C) -> Option<RoceAt> {
    let l2 = parse::parse_l2(ctx).ok()?;
    let (src, dst, family, l4_off, l4_end, protocol, tos) = match l2.kind {
        L3Kind::V4 => {
            let ip = parse::parse_ipv4(ctx, l2.l3_off).ok()?;
            // SAFETY: parse_ipv4 checked the header lies in the packet.
            let (src, dst, protocol, tos) =
                unsafe { ((*ip.hdr).src_addr, (*ip.hdr).dst_addr, (*ip.hdr).proto, (*ip.hdr).tos) };
            (ipv4_words(src), ipv4_words(dst), 4, ip.l4_off, ip.l4_end, protocol, tos)
        }
        L3Kind::V6 => {
            let ip = parse::parse_ipv6(ctx, l2.l3_off).ok()?;
            // SAFETY: parse_ipv6 checked the header lies in the packet.
            let (src, dst, protocol, vcf) =
                unsafe { (&(*ip.hdr).src_addr, &(*ip.hdr).dst_addr, (*ip.hdr).next_hdr, (*ip.hdr).vcf) };
            (
                ipv6_words(src),
                ipv6_words(dst),
                6,
                ip.l4_off,
                ip.l4_end,
                protocol,
                ((vcf[0] & 0x0F) << 4) | (vcf[1] >> 4),
            )
        }
    };
    if protocol != IPPROTO_UDP {
        return None;
    }
    let udp: *const UdpHdr = ptr_at(ctx, l4_off)?;
    // SAFETY: ptr_at checked the header lies in the packet.
    let (src_port, dst_port) = unsafe { (u16::from_be_bytes((*udp).src), u16::from_be_bytes((*udp).dst)) };
    let bth_off = l4_off + UdpHdr::LEN;
    if dst_port != ROCEV2_UDP_PORT || bth_off + BTH_LEN > l4_end {
        return None;
    }
    let b: *const [u8; BTH_LEN] = ptr_at(ctx, bth_off)?;
    // SAFETY: as above.
    let bth = Bth::parse(unsafe { &*b });
    Some(RoceAt { src, dst, family, src_port, ecn: tos & 3, tos, bth_off, bth })
}

/// The AETH syndrome of an ACK (the byte after the BTH), if in the packet.
#[inline(always)]
pub fn aeth_syndrome<C: PacketBuf>(ctx: &C, at: &RoceAt) -> Option<u8> {
    // The whole AETH: a one-byte bounds check compiles to a form the
    // verifier does not accept.
    // The offset may come back from a map (per-CPU scratch) where the
    // verifier no longer knows its bounds: the mask restores them (a BTH
    // is never beyond byte 255: Ethernet, VLAN, IPv4 with options, UDP).
    let p: *const [u8; aeth::LEN] = ptr_at(ctx, (at.bth_off & 0xFF) + BTH_LEN)?;
    // SAFETY: ptr_at checked the bytes lie in the packet.
    Some(unsafe { (*p)[0] })
}
