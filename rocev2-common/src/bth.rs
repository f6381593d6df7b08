//! RoCEv2 Base Transport Header (BTH): the 12 bytes after the UDP header.
//!
//! Layout (InfiniBand spec vol. 1, 9.2): byte 0 opcode, 1 flags/pad/tver,
//! 2-3 P_Key, 4 FECN/BECN, 5-7 DestQP, 8 AckReq, 9-11 PSN.

/// UDP destination port that marks a packet as RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// Length of the BTH in bytes.
pub const BTH_LEN: usize = 12;
/// Length of the invariant CRC trailer at the end of every RoCEv2 packet.
pub const ICRC_LEN: usize = 4;
/// PSNs, DestQPs and MSNs are 24-bit numbers.
pub const PSN_MASK: u32 = 0xFF_FFFF;

/// The flow label a Linux RDMA stack derives for a QP pair
/// (`rdma_calc_flow_label`): a 20-bit fold of local QPN x remote QPN.
pub fn flow_label(local_qpn: u32, remote_qpn: u32) -> u32 {
    let mut v = u64::from(local_qpn) * u64::from(remote_qpn);
    v ^= v >> 20;
    v ^= v >> 40;
    (v & 0xF_FFFF) as u32
}

/// The RoCEv2 UDP source port a NIC derives from a flow label (Linux
/// `rdma_flow_label_to_udp_sport`): 14 bits, in 0xC000..=0xFFFF.
pub fn nic_sport(flow_label: u32) -> u16 {
    let fl = flow_label & 0xF_FFFF;
    (((fl & 0x3FFF) ^ (fl >> 14)) | 0xC000) as u16
}

/// Selected BTH opcodes (RC unless noted).
pub mod opcode {
    pub const SEND_FIRST: u8 = 0x00;
    pub const SEND_MIDDLE: u8 = 0x01;
    pub const SEND_LAST: u8 = 0x02;
    pub const SEND_LAST_IMM: u8 = 0x03;
    pub const SEND_ONLY: u8 = 0x04;
    pub const SEND_ONLY_IMM: u8 = 0x05;
    pub const WRITE_FIRST: u8 = 0x06;
    pub const WRITE_MIDDLE: u8 = 0x07;
    pub const WRITE_LAST: u8 = 0x08;
    pub const WRITE_LAST_IMM: u8 = 0x09;
    pub const WRITE_ONLY: u8 = 0x0A;
    pub const WRITE_ONLY_IMM: u8 = 0x0B;
    pub const READ_REQUEST: u8 = 0x0C;
    pub const READ_RESPONSE_FIRST: u8 = 0x0D;
    pub const READ_RESPONSE_MIDDLE: u8 = 0x0E;
    pub const READ_RESPONSE_LAST: u8 = 0x0F;
    pub const READ_RESPONSE_ONLY: u8 = 0x10;
    pub const ACK: u8 = 0x11;
    pub const ATOMIC_ACK: u8 = 0x12;
    /// Congestion Notification Packet (RoCEv2 annex).
    pub const CNP: u8 = 0x81;
    /// UD SEND only.
    pub const UD_SEND_ONLY: u8 = 0x64;
}

/// The ACK Extended Transport Header (AETH) that follows the BTH of an
/// ACK: a syndrome byte and a 24-bit MSN. Syndrome bits 7..5 say what it
/// is: 000 ACK, 001 RNR NAK, 011 NAK (bits 4..0 name the error).
pub mod aeth {
    /// Length of the AETH in bytes.
    pub const LEN: usize = 4;
    /// A plain ACK with credit count 0x1F ("invalid": end-to-end credits
    /// not used), as NICs commonly send.
    pub const ACK: u8 = 0x1F;
    /// NAK: PSN sequence error (a PSN arrived ahead of the expected one).
    /// The AETH's BTH carries the expected PSN: go-back-N restarts there.
    pub const NAK_PSN_SEQUENCE_ERROR: u8 = 0x60;
    /// Receiver not ready NAK; bits 4..0 hold the timer.
    pub const RNR_NAK: u8 = 0x20;

    /// What an AETH syndrome reports.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Kind {
        Ack,
        RnrNak,
        SequenceError,
        /// Invalid request, remote access or operational error, ...
        OtherNak,
        Reserved,
    }

    pub const fn kind(syndrome: u8) -> Kind {
        match syndrome >> 5 {
            0 => Kind::Ack,
            1 => Kind::RnrNak,
            3 if syndrome & 0x1F == 0 => Kind::SequenceError,
            3 => Kind::OtherNak,
            _ => Kind::Reserved,
        }
    }
}

/// The fields of a BTH that the dataplane looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bth {
    pub opcode: u8,
    pub solicited: bool,
    pub pad_count: u8,
    pub pkey: u16,
    pub fecn: bool,
    pub becn: bool,
    pub dest_qp: u32,
    pub ack_req: bool,
    pub psn: u32,
}

impl Bth {
    /// A BTH with the default P_Key (0xFFFF), no flags and pad count 0:
    /// what most traffic and tests need; set other fields on the result.
    pub const fn new(opcode: u8, dest_qp: u32, psn: u32) -> Self {
        Self {
            opcode,
            solicited: false,
            pad_count: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp,
            ack_req: false,
            psn,
        }
    }

    /// Decodes a BTH from its 12 wire bytes. Every bit pattern is a valid
    /// BTH at this level; opcode meaning is checked by the helpers below.
    #[inline(always)]
    pub fn parse(b: &[u8; BTH_LEN]) -> Self {
        Self {
            opcode: b[0],
            solicited: b[1] & 0x80 != 0,
            pad_count: (b[1] >> 4) & 0x3,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            fecn: b[4] & 0x80 != 0,
            becn: b[4] & 0x40 != 0,
            dest_qp: dest_qp(b),
            ack_req: b[8] & 0x80 != 0,
            psn: psn(b),
        }
    }

    /// Encodes the BTH to wire bytes (used by the generator and tests).
    pub fn to_bytes(&self) -> [u8; BTH_LEN] {
        let qp = self.dest_qp.to_be_bytes();
        let psn = self.psn.to_be_bytes();
        let pkey = self.pkey.to_be_bytes();
        [
            self.opcode,
            (u8::from(self.solicited) << 7) | ((self.pad_count & 3) << 4),
            pkey[0],
            pkey[1],
            (u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6),
            qp[1],
            qp[2],
            qp[3],
            u8::from(self.ack_req) << 7,
            psn[1],
            psn[2],
            psn[3],
        ]
    }
}

/// The 24-bit packet sequence number.
#[inline(always)]
pub fn psn(b: &[u8; BTH_LEN]) -> u32 {
    u32::from_be_bytes([0, b[9], b[10], b[11]])
}

/// The 24-bit destination QP number, the field Enhanced ECMP adds to the hash.
#[inline(always)]
pub fn dest_qp(b: &[u8; BTH_LEN]) -> u32 {
    u32::from_be_bytes([0, b[5], b[6], b[7]])
}

/// True for packets after which the sender starts a new message on this QP:
/// the last or only packet of a SEND/WRITE/READ response, and ACKs. Moving a
/// flow to another path right after such a packet cannot reorder packets
/// inside one RDMA message.
#[inline(always)]
pub fn ends_message(opcode: u8) -> bool {
    // Transport class in bits 7..5 (RC, UC, RD, UD); the operation in 4..0.
    let op = opcode & 0x1F;
    matches!(
        op,
        opcode::SEND_LAST
            | opcode::SEND_LAST_IMM
            | opcode::SEND_ONLY
            | opcode::SEND_ONLY_IMM
            | opcode::WRITE_LAST
            | opcode::WRITE_LAST_IMM
            | opcode::WRITE_ONLY
            | opcode::WRITE_ONLY_IMM
            | opcode::READ_REQUEST
            | opcode::READ_RESPONSE_LAST
            | opcode::READ_RESPONSE_ONLY
            | opcode::ACK
            | opcode::ATOMIC_ACK
    ) || opcode == opcode::CNP
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_field_at_its_offset() {
        let wire = [0x0A, 0xB0, 0xFF, 0xFF, 0xC0, 0x12, 0x34, 0x56, 0x80, 0xAB, 0xCD, 0xEF];
        let bth = Bth::parse(&wire);
        assert_eq!(bth.opcode, opcode::WRITE_ONLY);
        assert!(bth.solicited);
        assert_eq!(bth.pad_count, 3);
        assert_eq!(bth.pkey, 0xFFFF);
        assert!(bth.fecn && bth.becn);
        assert_eq!(bth.dest_qp, 0x12_3456);
        assert!(bth.ack_req);
        assert_eq!(bth.psn, 0xAB_CDEF);
        assert_eq!(bth.to_bytes(), wire);
    }

    #[test]
    fn dest_qp_is_24_bits_big_endian() {
        let mut wire = [0u8; BTH_LEN];
        wire[4] = 0xFF; // FECN/BECN byte must not leak into the QP
        wire[5..8].copy_from_slice(&[0x00, 0x00, 0x01]);
        assert_eq!(dest_qp(&wire), 1);
        wire[5..8].copy_from_slice(&[0xFF, 0xFF, 0xFF]);
        assert_eq!(dest_qp(&wire), 0xFF_FFFF);
    }

    #[test]
    fn message_boundaries() {
        assert!(!ends_message(opcode::WRITE_FIRST));
        assert!(!ends_message(opcode::WRITE_MIDDLE));
        assert!(ends_message(opcode::WRITE_LAST));
        assert!(ends_message(opcode::WRITE_ONLY_IMM));
        assert!(ends_message(opcode::ACK));
        assert!(ends_message(opcode::CNP));
        // UC WRITE last = 0x20 | 0x08.
        assert!(ends_message(0x28));
        assert!(!ends_message(0x26));
    }
}
