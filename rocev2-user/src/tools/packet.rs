//! Building and checking whole RoCEv2 Ethernet frames in userspace.
//!
//! The generator, the integration tests and the lab all need frames that a
//! real RDMA NIC would accept: right lengths, a valid IPv4 header checksum, a
//! valid UDP checksum on IPv6 and, above all, a correct ICRC. The ICRC is what
//! tells us whether the dataplane only touched the fields a switch may touch
//! (TTL, DSCP/ECN, flow label, FECN/BECN), so [`icrc`] and
//! [`invariant_bytes_equal`] are the checks tests build on.
//!
//! ICRC byte order: the CRC-32 (the zlib/Ethernet polynomial, as computed by
//! `crc32fast`) is carried least significant byte first, the same way the
//! Ethernet FCS is. That is what scapy's `BTH.pack_icrc` writes and what a
//! ConnectX-4 Lx put on the wire in scapy's captured test vector (see the
//! tests). [`icrc`] returns the CRC value; its wire bytes are
//! `value.to_le_bytes()`.

use std::net::IpAddr;

use etherparse::{
    EtherType, Ethernet2Header, IpDscp, IpEcn, IpNumber, Ipv4Header, Ipv6FlowLabel, Ipv6Header, LinkExtSlice,
    LinkSlice, NetSlice, SingleVlanHeader, SlicedPacket, TcpHeader, TransportSlice, UdpHeader, VlanId, VlanPcp,
};
use rocev2_common::{
    bth::{Bth, BTH_LEN, ICRC_LEN, ROCEV2_UDP_PORT},
    checksum::internet_checksum,
};

/// Length of the all-ones prefix that stands in for the InfiniBand LRH in
/// the ICRC computation.
const ICRC_PREFIX_LEN: usize = 8;
const UDP_HEADER_LEN: usize = 8;

/// Why a frame is not a RoCEv2 frame we can check.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PacketError {
    #[error("malformed or truncated frame: {0}")]
    Malformed(String),
    #[error("not an Ethernet II frame")]
    NotEthernet,
    #[error("unsupported link extension (MACsec) in frame")]
    UnsupportedLinkExt,
    #[error("not an IPv4/IPv6 packet")]
    NotIp,
    #[error("IP payload is fragmented")]
    Fragmented,
    #[error("not a UDP datagram")]
    NotUdp,
    #[error("UDP destination port {0} is not the RoCEv2 port 4791")]
    NotRoce(u16),
    #[error("UDP payload of {0} bytes is too short for BTH + ICRC")]
    TooShort(usize),
}

/// Everything needed to build one RoCEv2 frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoceFrameSpec {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// 802.1Q VLAN id (priority 0), or untagged.
    pub vlan: Option<u16>,
    /// Both addresses must be of the same family.
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    /// IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
    /// 6 bits.
    pub dscp: u8,
    /// 2 bits: 0 Not-ECT, 2 ECT(0), 1 ECT(1), 3 CE.
    pub ecn: u8,
    /// The UDP destination port is always 4791.
    pub src_port: u16,
    /// The BTH; its `pad_count` is ignored and set from `payload_len`.
    pub bth: Bth,
    /// Bytes after the BTH (extension headers included, if a test wants
    /// them it writes them itself) before pad and ICRC, filled with
    /// [`payload_pattern`].
    pub payload_len: usize,
}

impl RoceFrameSpec {
    /// The pad count the frame will carry: payload rounded up to 4 bytes.
    pub fn pad_len(&self) -> usize {
        (4 - self.payload_len % 4) % 4
    }

    /// Plain (non-RoCE) traffic between the same hosts, for tests that check
    /// other traffic is left alone.
    pub fn plain(&self, src_port: u16, dst_port: u16, payload_len: usize) -> PlainFrameSpec {
        PlainFrameSpec {
            src_mac: self.src_mac,
            dst_mac: self.dst_mac,
            vlan: self.vlan,
            src_ip: self.src_ip,
            dst_ip: self.dst_ip,
            ttl: self.ttl,
            dscp: self.dscp,
            ecn: self.ecn,
            src_port,
            dst_port,
            payload_len,
        }
    }
}

/// Addressing and size of a plain UDP or TCP test frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlainFrameSpec {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub vlan: Option<u16>,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    pub ttl: u8,
    pub dscp: u8,
    pub ecn: u8,
    pub src_port: u16,
    pub dst_port: u16,
    /// Filled with [`payload_pattern`].
    pub payload_len: usize,
}

/// Deterministic payload bytes: a period of 251 (prime) so the pattern never
/// lines up with 4-byte words and a shifted or swapped word shows.
pub fn payload_pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Everything below the transport header, shared by all builders.
struct Envelope {
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    vlan: Option<u16>,
    src_ip: IpAddr,
    dst_ip: IpAddr,
    ttl: u8,
    dscp: u8,
    ecn: u8,
}

enum IpHeader {
    V4(Ipv4Header),
    V6(Ipv6Header),
}

impl IpHeader {
    fn to_bytes(&self) -> Vec<u8> {
        match self {
            IpHeader::V4(h) => h.to_bytes().to_vec(),
            IpHeader::V6(h) => h.to_bytes().to_vec(),
        }
    }
}

impl Envelope {
    /// # Panics
    /// On mixed address families or out-of-range DSCP/ECN/VLAN values: these
    /// are mistakes in the test, not conditions to handle.
    fn ip_header(&self, protocol: IpNumber, l4_len: usize) -> IpHeader {
        let dscp = IpDscp::try_new(self.dscp).expect("dscp must fit in 6 bits");
        let ecn = IpEcn::try_new(self.ecn).expect("ecn must fit in 2 bits");
        match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(src), IpAddr::V4(dst)) => {
                let mut h = Ipv4Header::new(0, self.ttl, protocol, src.octets(), dst.octets())
                    .expect("IPv4 header without payload");
                h.set_payload_len(l4_len).expect("frame too large for IPv4");
                h.dscp = dscp;
                h.ecn = ecn;
                // RoCE NICs set DF: RDMA never relies on fragmentation.
                h.dont_fragment = true;
                h.header_checksum = h.calc_header_checksum();
                IpHeader::V4(h)
            }
            (IpAddr::V6(src), IpAddr::V6(dst)) => {
                let mut h = Ipv6Header {
                    traffic_class: 0,
                    flow_label: Ipv6FlowLabel::ZERO,
                    payload_length: 0,
                    next_header: protocol,
                    hop_limit: self.ttl,
                    source: src.octets(),
                    destination: dst.octets(),
                };
                h.set_payload_length(l4_len).expect("frame too large for IPv6");
                h.set_dscp(dscp);
                h.set_ecn(ecn);
                IpHeader::V6(h)
            }
            (s, d) => panic!("source {s} and destination {d} must be of the same IP family"),
        }
    }

    fn frame(&self, ip: &IpHeader, l4: &[u8]) -> Vec<u8> {
        let ip_type = match ip {
            IpHeader::V4(_) => EtherType::IPV4,
            IpHeader::V6(_) => EtherType::IPV6,
        };
        let eth = Ethernet2Header {
            source: self.src_mac,
            destination: self.dst_mac,
            ether_type: if self.vlan.is_some() { EtherType::VLAN_TAGGED_FRAME } else { ip_type },
        };
        let mut out = Vec::with_capacity(64 + l4.len());
        out.extend_from_slice(&eth.to_bytes());
        if let Some(id) = self.vlan {
            let vlan = SingleVlanHeader {
                pcp: VlanPcp::ZERO,
                drop_eligible_indicator: false,
                vlan_id: VlanId::try_new(id).expect("VLAN id must fit in 12 bits"),
                ether_type: ip_type,
            };
            out.extend_from_slice(&vlan.to_bytes());
        }
        out.extend_from_slice(&ip.to_bytes());
        out.extend_from_slice(l4);
        out
    }
}

impl From<&RoceFrameSpec> for Envelope {
    fn from(s: &RoceFrameSpec) -> Self {
        Envelope {
            src_mac: s.src_mac,
            dst_mac: s.dst_mac,
            vlan: s.vlan,
            src_ip: s.src_ip,
            dst_ip: s.dst_ip,
            ttl: s.ttl,
            dscp: s.dscp,
            ecn: s.ecn,
        }
    }
}

impl From<&PlainFrameSpec> for Envelope {
    fn from(s: &PlainFrameSpec) -> Self {
        Envelope {
            src_mac: s.src_mac,
            dst_mac: s.dst_mac,
            vlan: s.vlan,
            src_ip: s.src_ip,
            dst_ip: s.dst_ip,
            ttl: s.ttl,
            dscp: s.dscp,
            ecn: s.ecn,
        }
    }
}

/// Builds Ethernet / [802.1Q] / IPv4|IPv6 / UDP 4791 / BTH / payload / pad /
/// ICRC with every checksum right: IPv4 header checksum, UDP checksum 0 on
/// IPv4 (what RoCE NICs send) and a real one on IPv6 (where 0 is not allowed),
/// and the ICRC.
///
/// # Panics
/// On mixed IP families or out-of-range DSCP/ECN/VLAN values.
pub fn build_roce_frame(spec: &RoceFrameSpec) -> Vec<u8> {
    build_roce_frame_with_header(spec, &[])
}

/// Like [`build_roce_frame`], with `ext` (an extension header such as an
/// AETH or RETH) as the first bytes after the BTH and the pattern after it;
/// `spec.payload_len` counts both.
///
/// # Panics
/// As [`build_roce_frame`], and if `ext` is longer than the payload.
pub fn build_roce_frame_with_header(spec: &RoceFrameSpec, ext: &[u8]) -> Vec<u8> {
    assert!(ext.len() <= spec.payload_len, "extension header longer than the payload");
    let pad = spec.pad_len();
    let mut bth = spec.bth;
    bth.pad_count = pad as u8;

    let udp_len = UDP_HEADER_LEN + BTH_LEN + spec.payload_len + pad + ICRC_LEN;
    let envelope = Envelope::from(spec);
    let ip = envelope.ip_header(IpNumber::UDP, udp_len);

    let mut udp = Vec::with_capacity(udp_len);
    let udp_header = UdpHeader {
        source_port: spec.src_port,
        destination_port: ROCEV2_UDP_PORT,
        length: u16::try_from(udp_len).expect("frame too large for UDP"),
        checksum: 0,
    };
    udp.extend_from_slice(&udp_header.to_bytes());
    udp.extend_from_slice(&bth.to_bytes());
    let payload_at = udp.len();
    udp.extend_from_slice(&payload_pattern(spec.payload_len));
    udp[payload_at..payload_at + ext.len()].copy_from_slice(ext);
    udp.resize(udp_len, 0); // pad and ICRC placeholder

    // The ICRC masks the UDP checksum, but the IPv6 UDP checksum covers the
    // ICRC: so ICRC first, checksum second.
    let crc = icrc_of(&ip.to_bytes(), &udp);
    udp[udp_len - ICRC_LEN..].copy_from_slice(&crc.to_le_bytes());
    if let IpHeader::V6(h) = &ip {
        let sum = udp_header.calc_checksum_ipv6(h, &udp[UDP_HEADER_LEN..]).expect("UDP payload fits");
        udp[6..8].copy_from_slice(&sum.to_be_bytes());
    }
    envelope.frame(&ip, &udp)
}

/// A plain UDP frame with a valid UDP checksum (IPv4 and IPv6).
pub fn build_udp_frame(spec: &PlainFrameSpec) -> Vec<u8> {
    let payload = payload_pattern(spec.payload_len);
    let envelope = Envelope::from(spec);
    let ip = envelope.ip_header(IpNumber::UDP, UDP_HEADER_LEN + payload.len());
    let udp = match &ip {
        IpHeader::V4(h) => UdpHeader::with_ipv4_checksum(spec.src_port, spec.dst_port, h, &payload),
        IpHeader::V6(h) => UdpHeader::with_ipv6_checksum(spec.src_port, spec.dst_port, h, &payload),
    }
    .expect("UDP payload fits");
    let mut l4 = udp.to_bytes().to_vec();
    l4.extend_from_slice(&payload);
    envelope.frame(&ip, &l4)
}

/// A plain TCP segment (ACK+PSH, seq 1, ack 1) with a valid checksum: enough
/// for the dataplane to see TCP, not a connection.
pub fn build_tcp_frame(spec: &PlainFrameSpec) -> Vec<u8> {
    let payload = payload_pattern(spec.payload_len);
    let mut tcp = TcpHeader::new(spec.src_port, spec.dst_port, 1, 64240);
    tcp.acknowledgment_number = 1;
    tcp.ack = true;
    tcp.psh = true;
    let envelope = Envelope::from(spec);
    let ip = envelope.ip_header(IpNumber::TCP, tcp.header_len() + payload.len());
    tcp.checksum = match &ip {
        IpHeader::V4(h) => tcp.calc_checksum_ipv4(h, &payload),
        IpHeader::V6(h) => tcp.calc_checksum_ipv6(h, &payload),
    }
    .expect("TCP payload fits");
    let mut l4 = tcp.to_bytes().to_vec();
    l4.extend_from_slice(&payload);
    envelope.frame(&ip, &l4)
}

/// ICRC over `ip_header` (with any extension headers) and `udp` (UDP header
/// through the ICRC, whose own 4 bytes are left out), with the variant fields
/// set to all-ones (InfiniBand spec Annex A17, the RoCEv2 ICRC).
fn icrc_of(ip_header: &[u8], udp: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[0xFF; ICRC_PREFIX_LEN]);
    hasher.update(&masked_ip_header(ip_header));
    hasher.update(&masked_udp(udp)[..udp.len() - ICRC_LEN]);
    hasher.finalize()
}

fn masked_ip_header(ip_header: &[u8]) -> Vec<u8> {
    let mut h = ip_header.to_vec();
    if h[0] >> 4 == 4 {
        h[1] = 0xFF; // TOS: DSCP + ECN
        h[8] = 0xFF; // TTL
        h[10..12].fill(0xFF); // header checksum
    } else {
        h[0] |= 0x0F; // traffic class, high nibble
        h[1..4].fill(0xFF); // traffic class low nibble + flow label
        h[7] = 0xFF; // hop limit
    }
    h
}

fn masked_udp(udp: &[u8]) -> Vec<u8> {
    let mut u = udp.to_vec();
    u[6..8].fill(0xFF); // UDP checksum
    u[UDP_HEADER_LEN + 4] = 0xFF; // BTH byte 4: FECN, BECN, reserved
    u
}

/// Where the ICRC-relevant parts of a frame are, found with etherparse.
struct Located<'a> {
    sliced: SlicedPacket<'a>,
    /// IP header including IPv4 options / IPv6 extension headers.
    ip_header: &'a [u8],
    /// UDP header through the ICRC (Ethernet padding excluded).
    udp: &'a [u8],
}

fn locate(frame: &[u8]) -> Result<Located<'_>, PacketError> {
    let sliced = SlicedPacket::from_ethernet(frame).map_err(|e| PacketError::Malformed(e.to_string()))?;
    if !matches!(sliced.link, Some(LinkSlice::Ethernet2(_))) {
        return Err(PacketError::NotEthernet);
    }
    if sliced.link_exts.iter().any(|e| matches!(e, LinkExtSlice::Macsec(_))) {
        return Err(PacketError::UnsupportedLinkExt);
    }
    let (net_start, payload_start) = match &sliced.net {
        Some(NetSlice::Ipv4(v4)) => {
            if v4.is_payload_fragmented() {
                return Err(PacketError::Fragmented);
            }
            (v4.header().slice().as_ptr(), v4.payload().payload.as_ptr())
        }
        Some(NetSlice::Ipv6(v6)) => {
            if v6.is_payload_fragmented() {
                return Err(PacketError::Fragmented);
            }
            (v6.header().slice().as_ptr(), v6.payload().payload.as_ptr())
        }
        _ => return Err(PacketError::NotIp),
    };
    let Some(TransportSlice::Udp(udp)) = &sliced.transport else {
        return Err(PacketError::NotUdp);
    };
    if udp.destination_port() != ROCEV2_UDP_PORT {
        return Err(PacketError::NotRoce(udp.destination_port()));
    }
    if udp.payload().len() < BTH_LEN + ICRC_LEN {
        return Err(PacketError::TooShort(udp.payload().len()));
    }
    // etherparse hands out sub-slices of `frame`; turn them into offsets so
    // the IP header is taken with its options/extension headers.
    let offset = |p: *const u8| p as usize - frame.as_ptr() as usize;
    let ip_header = &frame[offset(net_start)..offset(payload_start)];
    let udp = udp.slice();
    Ok(Located { sliced, ip_header, udp })
}

impl Located<'_> {
    fn icrc(&self) -> u32 {
        icrc_of(self.ip_header, self.udp)
    }

    fn wire_icrc(&self) -> u32 {
        let tail = &self.udp[self.udp.len() - ICRC_LEN..];
        u32::from_le_bytes(tail.try_into().expect("4 bytes"))
    }

    fn bth(&self) -> Bth {
        let bytes = &self.udp[UDP_HEADER_LEN..UDP_HEADER_LEN + BTH_LEN];
        Bth::parse(bytes.try_into().expect("BTH_LEN bytes"))
    }

    /// The ICRC-covered bytes (ICRC included) with the variant fields masked.
    fn invariant_bytes(&self) -> Vec<u8> {
        let mut v = masked_ip_header(self.ip_header);
        v.extend_from_slice(&masked_udp(self.udp));
        v
    }
}

/// Computes the ICRC a RoCEv2 Ethernet frame should carry (skipping the
/// Ethernet/VLAN headers and any Ethernet padding). Compare with the frame's
/// last 4 UDP payload bytes read as little endian, or use [`parse_roce`].
pub fn icrc(frame: &[u8]) -> Result<u32, PacketError> {
    Ok(locate(frame)?.icrc())
}

/// A decoded RoCEv2 frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedRoce {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// Outermost VLAN id, if tagged.
    pub vlan: Option<u16>,
    pub src_ip: IpAddr,
    pub dst_ip: IpAddr,
    pub ttl_or_hop_limit: u8,
    pub dscp: u8,
    pub ecn: u8,
    pub src_port: u16,
    pub dst_port: u16,
    pub bth: Bth,
    /// Bytes between the BTH and the pad (extension headers included).
    pub payload_len: usize,
    /// Where the BTH starts in the frame; extension headers (RETH, AETH)
    /// follow it.
    pub bth_offset: usize,
    /// The ICRC as carried by the frame (wire bytes read little endian).
    pub icrc: u32,
    pub icrc_ok: bool,
    /// None for IPv6, which has no header checksum.
    pub ipv4_checksum_ok: Option<bool>,
    /// The whole frame, as given (Ethernet padding included).
    pub frame_len: usize,
}

/// Decodes a RoCEv2 frame and checks its ICRC and IPv4 header checksum.
/// Errors for anything that is not Ethernet / \[VLAN\] / IP / UDP 4791 with
/// room for BTH and ICRC, or is truncated.
pub fn parse_roce(frame: &[u8]) -> Result<ParsedRoce, PacketError> {
    let loc = locate(frame)?;
    let Some(LinkSlice::Ethernet2(eth)) = &loc.sliced.link else {
        return Err(PacketError::NotEthernet);
    };
    let vlan = loc.sliced.vlan_ids().first().map(|id| id.value());
    let (src_ip, dst_ip, ttl, dscp, ecn, ipv4_checksum_ok) = match &loc.sliced.net {
        Some(NetSlice::Ipv4(v4)) => {
            let h = v4.header();
            let ok = internet_checksum(h.slice()) == 0;
            let (src, dst) = (h.source_addr().into(), h.destination_addr().into());
            (src, dst, h.ttl(), h.dcp().value(), h.ecn().value(), Some(ok))
        }
        Some(NetSlice::Ipv6(v6)) => {
            let h = v6.header();
            let (src, dst) = (h.source_addr().into(), h.destination_addr().into());
            (src, dst, h.hop_limit(), h.dscp().value(), h.ecn().value(), None)
        }
        _ => return Err(PacketError::NotIp),
    };
    let bth = loc.bth();
    let udp_payload = loc.udp.len() - UDP_HEADER_LEN;
    let after_bth = udp_payload - BTH_LEN - ICRC_LEN;
    let (icrc, wire) = (loc.icrc(), loc.wire_icrc());
    Ok(ParsedRoce {
        src_mac: eth.source(),
        dst_mac: eth.destination(),
        vlan,
        src_ip,
        dst_ip,
        ttl_or_hop_limit: ttl,
        dscp,
        ecn,
        src_port: u16::from_be_bytes([loc.udp[0], loc.udp[1]]),
        dst_port: u16::from_be_bytes([loc.udp[2], loc.udp[3]]),
        bth,
        payload_len: after_bth.saturating_sub(usize::from(bth.pad_count)),
        bth_offset: loc.udp.as_ptr() as usize - frame.as_ptr() as usize + UDP_HEADER_LEN,
        icrc: wire,
        icrc_ok: icrc == wire,
        ipv4_checksum_ok,
        frame_len: frame.len(),
    })
}

/// True if both frames are RoCEv2 and agree on every byte the ICRC protects
/// (addresses, ports, lengths, BTH but byte 4, payload, the ICRC itself):
/// i.e. they differ at most in what a switch may rewrite (MACs, VLAN, TTL /
/// hop limit, DSCP/ECN, flow label, IPv4 and UDP checksums, FECN/BECN).
/// False if either is not a parseable RoCEv2 frame.
pub fn invariant_bytes_equal(a: &[u8], b: &[u8]) -> bool {
    match (locate(a), locate(b)) {
        (Ok(a), Ok(b)) => a.invariant_bytes() == b.invariant_bytes(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::{
        net::{Ipv4Addr, Ipv6Addr},
        process::Command,
    };

    use rocev2_common::bth::opcode;

    use super::*;

    fn v4_spec() -> RoceFrameSpec {
        RoceFrameSpec {
            src_mac: [0x02, 0, 0, 0, 0, 0x01],
            dst_mac: [0x02, 0, 0, 0, 0, 0x02],
            vlan: None,
            src_ip: Ipv4Addr::new(10, 0, 1, 2).into(),
            dst_ip: Ipv4Addr::new(10, 0, 2, 9).into(),
            ttl: 64,
            dscp: 26,
            ecn: 2,
            src_port: 0xC123,
            bth: Bth { ack_req: true, ..Bth::new(opcode::WRITE_MIDDLE, 0x12_3456, 0xAB_CDEF) },
            payload_len: 1024,
        }
    }

    fn v6_spec() -> RoceFrameSpec {
        RoceFrameSpec {
            src_ip: "fd00::1:2".parse::<Ipv6Addr>().unwrap().into(),
            dst_ip: "fd00::2:9".parse::<Ipv6Addr>().unwrap().into(),
            ..v4_spec()
        }
    }

    /// A spread of frames: both families, VLAN or not, every pad count,
    /// opcodes with and without end-of-message meaning, CE and FECN set.
    fn sample_specs() -> Vec<RoceFrameSpec> {
        let mut specs = Vec::new();
        for (i, base) in [v4_spec(), v6_spec()].into_iter().enumerate() {
            for (j, &(vlan, payload_len)) in
                [(None, 0), (Some(100), 1), (None, 2), (Some(4094), 3), (None, 4096), (Some(7), 4093)]
                    .iter()
                    .enumerate()
            {
                let mut s = base.clone();
                s.vlan = vlan;
                s.payload_len = payload_len;
                s.bth.opcode = [opcode::SEND_ONLY, opcode::WRITE_LAST, opcode::ACK, 0x24][j % 4];
                s.bth.dest_qp = 0x10_0000 * i as u32 + j as u32 + 1;
                s.bth.psn = 0xFF_FFF0 + j as u32;
                s.bth.fecn = j == 3;
                s.ecn = [0, 1, 2, 3][j % 4];
                s.dscp = [0, 26, 48, 63][(i + j) % 4];
                s.ttl = 1 + 50 * j as u8;
                s.src_port = 0xC000 | (j as u16 * 0x111);
                specs.push(s);
            }
        }
        specs
    }

    fn eth_ip_offset(frame: &[u8]) -> usize {
        if frame[12..14] == [0x81, 0x00] {
            18
        } else {
            14
        }
    }

    #[test]
    fn ipv4_header_checksum_and_lengths() {
        for spec in sample_specs().iter().filter(|s| s.src_ip.is_ipv4()) {
            let f = build_roce_frame(spec);
            let ip = eth_ip_offset(&f);
            let pad = (4 - spec.payload_len % 4) % 4;
            let udp_len = 8 + BTH_LEN + spec.payload_len + pad + ICRC_LEN;
            assert_eq!(f.len(), ip + 20 + udp_len);
            assert_eq!(internet_checksum(&f[ip..ip + 20]), 0, "IPv4 header checksum");
            assert_eq!(u16::from_be_bytes([f[ip + 2], f[ip + 3]]) as usize, 20 + udp_len);
            assert_eq!(f[ip + 6] & 0x40, 0x40, "DF set");
            assert_eq!(f[ip + 9], 17);
            let udp = ip + 20;
            assert_eq!(u16::from_be_bytes([f[udp + 2], f[udp + 3]]), ROCEV2_UDP_PORT);
            assert_eq!(u16::from_be_bytes([f[udp + 4], f[udp + 5]]) as usize, udp_len);
            assert_eq!(f[udp + 6..udp + 8], [0, 0], "IPv4 RoCE sends UDP checksum 0");
            assert_eq!((f[udp + 9] >> 4) & 3, pad as u8, "BTH pad count");
            assert_eq!((BTH_LEN + spec.payload_len + pad) % 4, 0);
        }
    }

    #[test]
    fn ipv6_lengths_and_udp_checksum() {
        for spec in sample_specs().iter().filter(|s| s.src_ip.is_ipv6()) {
            let f = build_roce_frame(spec);
            let ip = eth_ip_offset(&f);
            let udp_len = f.len() - ip - 40;
            assert_eq!(u16::from_be_bytes([f[ip + 4], f[ip + 5]]) as usize, udp_len);
            assert_eq!(u16::from_be_bytes([f[ip + 44], f[ip + 45]]) as usize, udp_len);
            // Pseudo-header + UDP datagram sums to zero when the checksum is right.
            let mut pseudo = f[ip + 8..ip + 40].to_vec();
            pseudo.extend_from_slice(&(udp_len as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 17]);
            pseudo.extend_from_slice(&f[ip + 40..]);
            assert_ne!(f[ip + 46..ip + 48], [0, 0], "IPv6 UDP checksum is mandatory");
            assert_eq!(internet_checksum(&pseudo), 0, "IPv6 UDP checksum");
        }
    }

    #[test]
    fn parse_round_trips_every_field() {
        for spec in sample_specs() {
            let f = build_roce_frame(&spec);
            let p = parse_roce(&f).unwrap();
            let mut bth = spec.bth;
            bth.pad_count = spec.pad_len() as u8;
            assert_eq!(p.src_mac, spec.src_mac);
            assert_eq!(p.dst_mac, spec.dst_mac);
            assert_eq!(p.vlan, spec.vlan);
            assert_eq!(p.src_ip, spec.src_ip);
            assert_eq!(p.dst_ip, spec.dst_ip);
            assert_eq!(p.ttl_or_hop_limit, spec.ttl);
            assert_eq!(p.dscp, spec.dscp);
            assert_eq!(p.ecn, spec.ecn);
            assert_eq!(p.src_port, spec.src_port);
            assert_eq!(p.dst_port, ROCEV2_UDP_PORT);
            assert_eq!(p.bth, bth);
            assert_eq!(p.payload_len, spec.payload_len);
            assert!(p.icrc_ok, "{spec:?}");
            assert_eq!(p.icrc.to_le_bytes(), f[f.len() - 4..]);
            assert_eq!(p.ipv4_checksum_ok, spec.src_ip.is_ipv4().then_some(true));
            assert_eq!(p.frame_len, f.len());
        }
    }

    #[test]
    fn ethernet_padding_is_ignored() {
        let mut spec = v4_spec();
        spec.payload_len = 0; // 14 + 20 + 8 + 12 + 4 = 58 bytes: below the 60-byte minimum
        let mut f = build_roce_frame(&spec);
        let unpadded = f.clone();
        f.resize(60, 0);
        let p = parse_roce(&f).unwrap();
        assert!(p.icrc_ok);
        assert_eq!(p.frame_len, 60);
        assert!(invariant_bytes_equal(&f, &unpadded));
    }

    #[test]
    fn parse_rejects_non_roce_and_broken_frames() {
        let spec = v4_spec();
        let f = build_roce_frame(&spec);
        assert!(matches!(parse_roce(&f[..30]), Err(PacketError::Malformed(_))));
        assert!(matches!(parse_roce(&f[..f.len() - 1]), Err(PacketError::Malformed(_))));
        let udp = build_udp_frame(&spec.plain(1234, 53, 40));
        assert_eq!(parse_roce(&udp), Err(PacketError::NotRoce(53)));
        let tcp = build_tcp_frame(&spec.plain(1234, ROCEV2_UDP_PORT, 40));
        assert_eq!(parse_roce(&tcp), Err(PacketError::NotUdp));
        // UDP to 4791 but too short for BTH + ICRC.
        let short = build_udp_frame(&spec.plain(1234, ROCEV2_UDP_PORT, 15));
        assert_eq!(parse_roce(&short), Err(PacketError::TooShort(15)));
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&[0x88, 0xB5]); // local experimental ethertype
        assert!(parse_roce(&arp).is_err());
    }

    #[test]
    fn plain_frames_are_valid() {
        for base in [v4_spec(), v6_spec()] {
            for vlan in [None, Some(5)] {
                let mut spec = base.plain(40000, 80, 33);
                spec.vlan = vlan;
                for (f, tcp) in [(build_udp_frame(&spec), false), (build_tcp_frame(&spec), true)] {
                    let s = SlicedPacket::from_ethernet(&f).unwrap();
                    assert_eq!(s.vlan_ids().first().map(|v| v.value()), vlan);
                    match (s.transport.unwrap(), tcp) {
                        (TransportSlice::Udp(u), false) => {
                            assert_eq!(u.destination_port(), 80);
                            assert_eq!(u.payload(), payload_pattern(33));
                            let ip = eth_ip_offset(&f);
                            let expect = match base.src_ip {
                                IpAddr::V4(_) => {
                                    let (h, _) = Ipv4Header::from_slice(&f[ip..]).unwrap();
                                    u.to_header().calc_checksum_ipv4(&h, u.payload()).unwrap()
                                }
                                IpAddr::V6(_) => {
                                    let (h, _) = Ipv6Header::from_slice(&f[ip..]).unwrap();
                                    u.to_header().calc_checksum_ipv6(&h, u.payload()).unwrap()
                                }
                            };
                            assert_eq!(u.checksum(), expect);
                        }
                        (TransportSlice::Tcp(t), true) => {
                            assert_eq!(t.destination_port(), 80);
                            assert_eq!(t.payload(), payload_pattern(33));
                            assert!(t.ack() && t.psh() && !t.syn());
                        }
                        _ => panic!("wrong transport"),
                    }
                }
            }
        }
    }

    #[test]
    fn icrc_covers_payload_but_not_variant_fields() {
        for base in [v4_spec(), v6_spec()] {
            let f = build_roce_frame(&base);
            let crc = icrc(&f).unwrap();

            let mut payload_changed = f.clone();
            payload_changed[f.len() - 10] ^= 1;
            assert_ne!(icrc(&payload_changed).unwrap(), crc);

            let variant: [fn(&mut RoceFrameSpec); 7] = [
                |s| s.ttl = 3,
                |s| s.ecn = 3,
                |s| s.dscp = 48,
                |s| s.bth.fecn = true,
                |s| s.bth.becn = true,
                |s| s.vlan = Some(9),
                |s| s.src_mac = [2, 9, 9, 9, 9, 9],
            ];
            for change in variant {
                let mut s = base.clone();
                change(&mut s);
                let g = build_roce_frame(&s);
                assert_ne!(f, g);
                assert_eq!(icrc(&g).unwrap(), crc, "{s:?}");
            }
            // Reserved bits of BTH byte 4 are masked too.
            let mut reserved = f.clone();
            let bth = f.len() - 4 - base.payload_len - BTH_LEN;
            reserved[bth + 4] |= 0x3F;
            assert_eq!(icrc(&reserved).unwrap(), crc);
            let protected: [fn(&mut RoceFrameSpec); 4] =
                [|s| s.bth.dest_qp ^= 1, |s| s.bth.psn ^= 1, |s| s.src_port ^= 1, |s| s.bth.opcode = opcode::SEND_LAST];
            for change in protected {
                let mut s = base.clone();
                change(&mut s);
                assert_ne!(icrc(&build_roce_frame(&s)).unwrap(), crc, "{s:?}");
            }
        }
    }

    #[test]
    fn invariant_bytes_detect_protected_changes_only() {
        for base in [v4_spec(), v6_spec()] {
            let f = build_roce_frame(&base);
            let ip = eth_ip_offset(&f);
            let udp = ip + if base.src_ip.is_ipv4() { 20 } else { 40 };
            let bth = udp + 8;

            // What a switch may do: new MACs, TTL-1 (+ checksum), ECN CE, FECN.
            let mut routed = f.clone();
            routed[0..12].copy_from_slice(&[6, 5, 4, 3, 2, 1, 1, 2, 3, 4, 5, 6]);
            if base.src_ip.is_ipv4() {
                routed[ip + 8] -= 1;
                routed[ip + 1] |= 3;
                routed[ip + 10..ip + 12].fill(0);
                let c = internet_checksum(&routed[ip..ip + 20]);
                routed[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
            } else {
                routed[ip + 7] -= 1;
                routed[ip + 1] |= 0x30;
                routed[ip + 3] ^= 0x5A; // flow label
            }
            routed[bth + 4] |= 0x80;
            assert!(invariant_bytes_equal(&f, &routed));
            assert!(parse_roce(&routed).unwrap().icrc_ok);

            for (what, at) in [
                ("DestQP", bth + 7),
                ("PSN", bth + 11),
                ("opcode", bth),
                ("payload", bth + 12 + 100),
                ("ICRC", f.len() - 1),
                ("UDP source port", udp + 1),
                ("source address", udp - 1),
            ] {
                let mut g = f.clone();
                g[at] ^= 0x01;
                assert!(!invariant_bytes_equal(&f, &g), "{what} change not detected");
            }
            assert!(!invariant_bytes_equal(&f, &f[..f.len() - 1]));
        }
    }

    /// scapy's own test vector (test/contrib/roce.uts, "RoCE layer"): a UC
    /// SEND only with IP checksum 0xb4d5 and ICRC read big endian as
    /// 0x78f353f3.
    const SCAPY_UC_SEND: &str = "248a07a8fa22248a07a8fa22080045010040047840004011b4d5c0a80007\
        c0a80007c00012b7002caca22460ffff000000d300cf17104630818be28935d90e9a95505401be885e5000\
        0078f353f3";

    /// A CNP captured on a ConnectX-4 Lx, from the same scapy test file: the
    /// ICRC a real NIC sent, so it pins down the byte order.
    const CX4_CNP: &str = "\
        e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2 003c 718c 4000 4011 9161 0a00 1101 0a00 \
        1201 0000 12b7 0028 0000 8100 ffff 4000 0118 0000 0000 0000 0000 0000 0000 0000 \
        0000 0000 0000 82fd 002a";

    fn unhex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap()).collect()
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn known_vectors_from_scapy_and_a_real_nic() {
        let uc = unhex(SCAPY_UC_SEND);
        let p = parse_roce(&uc).unwrap();
        assert_eq!(p.ipv4_checksum_ok, Some(true));
        assert_eq!(p.bth.opcode, 0x24);
        assert_eq!(p.bth.dest_qp, 211);
        assert_eq!(p.bth.psn, 13_571_856);
        assert_eq!(uc[uc.len() - 4..], [0x78, 0xf3, 0x53, 0xf3]);
        assert_eq!(icrc(&uc).unwrap(), 0xf353_f378);
        assert!(p.icrc_ok);

        let cnp = unhex(CX4_CNP);
        let p = parse_roce(&cnp).unwrap();
        assert_eq!(p.bth.opcode, opcode::CNP);
        assert!(p.bth.becn);
        assert_eq!(p.ecn, 2);
        assert_eq!(p.dscp, 48);
        assert_eq!(icrc(&cnp).unwrap().to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
        assert!(p.icrc_ok);
    }

    /// Checks our frames with scapy: scapy re-dissects each frame, recomputes
    /// the lengths, IP checksum, IPv6 UDP checksum and (where its version
    /// supports the IP family) the ICRC, and must produce the very same
    /// bytes. scapy < 2.6 has no IPv6 ICRC; for those frames the script
    /// computes the ICRC from scapy's masked fields with zlib.crc32 instead.
    const SCAPY_SCRIPT: &str = r#"
import inspect, struct, sys, zlib
from scapy.layers.l2 import Ether
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.contrib.roce import BTH

v6_icrc = "isinstance(ip, IPv6)" in inspect.getsource(BTH.compute_icrc)
bad = 0
for n, line in enumerate(open(sys.argv[1])):
    want = bytes.fromhex(line.strip())
    p = Ether(want)
    assert BTH in p, f"frame {n}: scapy sees no BTH"
    if IP in p:
        del p[IP].len, p[IP].chksum, p[UDP].len
    else:
        del p[IPv6].plen, p[UDP].len, p[UDP].chksum
    by_scapy = IP in p or v6_icrc
    if by_scapy:
        del p[BTH].icrc
        method = "scapy"
    else:
        q = p[IPv6].copy()
        q.tc, q.fl, q.hlim = 0xFF, 0xFFFFF, 0xFF
        q[UDP].chksum = 0xFFFF
        q[BTH].fecn, q[BTH].becn, q[BTH].resv6 = 1, 1, 0x3F
        crc = zlib.crc32(b"\xff" * 8 + bytes(q)[:-4])
        if struct.pack("<I", crc) != want[-4:]:
            print(f"frame {n}: ICRC {want[-4:].hex()} but zlib says {struct.pack('<I', crc).hex()}")
            bad += 1
        method = "zlib"
    got = bytes(p)
    if got != want:
        at = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
        print(f"frame {n} ({method}): scapy rebuilt {len(got)} bytes, we built {len(want)}; "
              f"first difference at byte {at}: {got[at:at + 8].hex()} vs {want[at:at + 8].hex()}")
        bad += 1
    else:
        print(f"OK {n} {method}")
sys.exit(1 if bad else 0)
"#;

    /// The first of these that can import scapy's RoCE layer: Debian's
    /// python3-scapy lives in /usr/bin/python3's dist-packages, which a
    /// pyenv or venv `python3` earlier on PATH does not see.
    fn python_with_scapy() -> Option<&'static str> {
        ["python3", "/usr/bin/python3"].into_iter().find(|py| {
            Command::new(py).args(["-c", "import scapy.contrib.roce"]).output().is_ok_and(|o| o.status.success())
        })
    }

    #[test]
    fn scapy_agrees_on_every_byte() {
        let Some(python) = python_with_scapy() else {
            if std::env::var("ROCEV2_SKIP_SCAPY").as_deref() == Ok("1") {
                eprintln!("SKIPPED: scapy not found and ROCEV2_SKIP_SCAPY=1");
                return;
            }
            panic!(
                "python3 with scapy is needed to cross-check the ICRC: \
                 apt-get install python3-scapy (or set ROCEV2_SKIP_SCAPY=1 to skip)"
            );
        };
        let specs = sample_specs();
        let frames: Vec<Vec<u8>> = specs.iter().map(build_roce_frame).collect();
        let path = std::env::temp_dir().join(format!("rocev2-scapy-{}.hex", std::process::id()));
        let text: String = frames.iter().map(|f| hex(f) + "\n").collect();
        std::fs::write(&path, text).unwrap();
        let out = Command::new(python).arg("-c").arg(SCAPY_SCRIPT).arg(&path).output().unwrap();
        let _ = std::fs::remove_file(&path);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "scapy disagrees:\n{stdout}\n{stderr}");
        let ok: Vec<&str> = stdout.lines().filter(|l| l.starts_with("OK ")).collect();
        assert_eq!(ok.len(), frames.len(), "{stdout}");
        // IPv4 ICRCs must come from scapy's own compute_icrc.
        for (spec, line) in specs.iter().zip(&ok) {
            if spec.src_ip.is_ipv4() {
                assert!(line.ends_with("scapy"), "{line}");
            }
        }
    }
}
