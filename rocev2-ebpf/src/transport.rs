//! Reads a RoCEv2 frame's transport headers. [`locate`] finds the BTH
//! from scratch, for the lab's fault injector and arrival recorder (the
//! tools object); telemetry instead reads the BTH and AETH where the
//! forwarding pipeline's own parse found the BTH ([`psn_at`],
//! [`aeth_syndrome`]).

use network_types::udp::UdpHdr;
use rocev2_common::{
    bth::{self, aeth, Bth, BTH_LEN, ROCEV2_UDP_PORT},
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

/// The PSN of the BTH at `bth_off`, if in the packet.
#[inline(always)]
pub fn psn_at<C: PacketBuf>(ctx: &C, bth_off: u8) -> Option<u32> {
    let b: *const [u8; BTH_LEN] = ptr_at(ctx, usize::from(bth_off))?;
    // SAFETY: ptr_at checked the bytes lie in the packet.
    Some(bth::psn(unsafe { &*b }))
}

/// The AETH syndrome of an ACK whose BTH is at `bth_off` (the byte after
/// the BTH), if in the packet. The offset is a byte, so the verifier
/// knows its bounds wherever it was kept.
#[inline(always)]
pub fn aeth_syndrome<C: PacketBuf>(ctx: &C, bth_off: u8) -> Option<u8> {
    // The whole AETH: a one-byte bounds check compiles to a form the
    // verifier does not accept.
    let p: *const [u8; aeth::LEN] = ptr_at(ctx, usize::from(bth_off) + BTH_LEN)?;
    // SAFETY: ptr_at checked the bytes lie in the packet.
    Some(unsafe { (*p)[0] })
}
