//! Header rewrites shared by the forwarding pipeline (XDP and tc), the tc
//! egress marker and the generator's transmit program. Only fields outside
//! the RoCEv2 ICRC are touched: MACs, TTL/hop limit, DSCP/ECN and the IPv4
//! header checksum.

use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};
use rocev2_common::checksum;

/// `tos` with its DSCP replaced and its ECN bits kept.
#[inline(always)]
pub fn with_dscp(tos: u8, dscp: u8) -> u8 {
    (dscp << 2) | (tos & 3)
}

/// The IPv6 traffic class, which straddles the header's first two bytes.
#[inline(always)]
pub fn ipv6_traffic_class(vcf: [u8; 4]) -> u8 {
    ((vcf[0] & 0x0F) << 4) | (vcf[1] >> 4)
}

/// # Safety
/// `eth` must point at a checked Ethernet header.
#[inline(always)]
pub unsafe fn set_macs(eth: *mut EthHdr, dst: [u8; 6], src: [u8; 6]) {
    unsafe {
        (*eth).dst_addr = dst;
        (*eth).src_addr = src;
    }
}

/// Writes TOS and TTL and patches the checksum for the two 16-bit words
/// that hold them (version/IHL+TOS, TTL+protocol; RFC 1624). A word that
/// does not change patches to itself.
///
/// # Safety
/// `hdr` must point at a checked 20-byte IPv4 header.
#[inline(always)]
pub unsafe fn set_ipv4_tos_ttl(hdr: *mut Ipv4Hdr, tos: u8, ttl: u8) {
    unsafe {
        let (vihl, old_tos, old_ttl, protocol) = ((*hdr).vihl, (*hdr).tos, (*hdr).ttl, (*hdr).proto);
        let check = u16::from_be_bytes((*hdr).check);
        let check = checksum::update_u16(check, u16::from_be_bytes([vihl, old_tos]), u16::from_be_bytes([vihl, tos]));
        let check =
            checksum::update_u16(check, u16::from_be_bytes([old_ttl, protocol]), u16::from_be_bytes([ttl, protocol]));
        (*hdr).tos = tos;
        (*hdr).ttl = ttl;
        (*hdr).check = check.to_be_bytes();
    }
}

/// Writes the traffic class and hop limit (IPv6 has no header checksum).
///
/// # Safety
/// `hdr` must point at a checked IPv6 header.
#[inline(always)]
pub unsafe fn set_ipv6_class_hop_limit(hdr: *mut Ipv6Hdr, traffic_class: u8, hop_limit: u8) {
    unsafe {
        let vcf = (*hdr).vcf;
        (*hdr).vcf[0] = (vcf[0] & 0xF0) | (traffic_class >> 4);
        (*hdr).vcf[1] = (vcf[1] & 0x0F) | (traffic_class << 4);
        (*hdr).hop_limit = hop_limit;
    }
}
