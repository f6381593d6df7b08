//! Priority classes: match RoCEv2 control packets (ACK, CNP, CTS-like small
//! messages) and give them a DSCP, an skb priority and an exemption from
//! ECN marking, as in Meta's receiver-driven admission design.

/// Most classes a config may define (the XDP program loops over them).
pub const MAX_CLASSES: u32 = 16;

/// Class flags.
pub const CLASS_SET_DSCP: u32 = 1;
pub const CLASS_SET_PRIORITY: u32 = 2;
pub const CLASS_ECN_EXEMPT: u32 = 4;
/// Match only packets whose BTH opcode bit is set in `opcodes`.
pub const CLASS_MATCH_OPCODE: u32 = 8;
pub const CLASS_MATCH_DSCP: u32 = 16;
pub const CLASS_MATCH_QP: u32 = 32;
pub const CLASS_MATCH_PAYLOAD: u32 = 64;
/// Use `profile` instead of the egress port's ECN profile.
pub const CLASS_ECN_PROFILE: u32 = 128;

/// Value of CLASSES (an array; CONFIG.class_count entries are live).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassEntry {
    /// Bit n of word n/64 set: opcode n matches.
    pub opcodes: [u64; 4],
    /// Bit n set: DSCP n matches.
    pub dscps: u64,
    pub qp_min: u32,
    pub qp_max: u32,
    /// Largest payload (bytes after the BTH, before pad and ICRC) that matches.
    pub max_payload: u32,
    pub flags: u32,
    pub set_dscp: u32,
    pub priority: u32,
    pub profile: u32,
    pub _reserved: u32,
}

const _: () = assert!(core::mem::size_of::<ClassEntry>() == 72);

#[cfg(feature = "user")]
unsafe impl aya::Pod for ClassEntry {}

/// What a matched class does: the part of [`ClassEntry`] the rewrite needs,
/// small enough to keep on the eBPF stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassAction {
    pub flags: u32,
    pub set_dscp: u32,
    pub priority: u32,
    pub profile: u32,
}

impl ClassEntry {
    #[inline(always)]
    pub fn action(&self) -> ClassAction {
        ClassAction { flags: self.flags, set_dscp: self.set_dscp, priority: self.priority, profile: self.profile }
    }
}

/// What classification looks at.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClassFields {
    /// None for non-RoCE packets: opcode, QP and payload matches fail.
    pub roce: Option<RoceFields>,
    pub dscp: u8,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct RoceFields {
    pub opcode: u8,
    pub dest_qp: u32,
    pub payload_len: u32,
}

/// True if every match the class sets holds. A class with no match bits
/// matches everything.
#[inline(always)]
pub fn matches(c: &ClassEntry, f: &ClassFields) -> bool {
    if c.flags & CLASS_MATCH_DSCP != 0 && (c.dscps >> (f.dscp & 63)) & 1 == 0 {
        return false;
    }
    let needs_roce = c.flags & (CLASS_MATCH_OPCODE | CLASS_MATCH_QP | CLASS_MATCH_PAYLOAD) != 0;
    if !needs_roce {
        return true;
    }
    let Some(r) = f.roce else { return false };
    if c.flags & CLASS_MATCH_OPCODE != 0 {
        let word = c.opcodes[(r.opcode >> 6) as usize & 3];
        if (word >> (r.opcode & 63)) & 1 == 0 {
            return false;
        }
    }
    if c.flags & CLASS_MATCH_QP != 0 && (r.dest_qp < c.qp_min || r.dest_qp > c.qp_max) {
        return false;
    }
    if c.flags & CLASS_MATCH_PAYLOAD != 0 && r.payload_len > c.max_payload {
        return false;
    }
    true
}

/// Sets the bit for `opcode` in an opcode bitmap.
pub fn add_opcode(map: &mut [u64; 4], opcode: u8) {
    map[(opcode >> 6) as usize] |= 1 << (opcode & 63);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bth::opcode;

    fn control() -> ClassEntry {
        let mut c = ClassEntry { flags: CLASS_MATCH_OPCODE, ..Default::default() };
        add_opcode(&mut c.opcodes, opcode::ACK);
        add_opcode(&mut c.opcodes, opcode::CNP);
        c
    }

    fn roce(opcode: u8, payload_len: u32) -> ClassFields {
        ClassFields { roce: Some(RoceFields { opcode, dest_qp: 0x100, payload_len }), dscp: 26 }
    }

    #[test]
    fn opcode_set_matches_ack_and_cnp_only() {
        let c = control();
        assert!(matches(&c, &roce(opcode::ACK, 4)));
        assert!(matches(&c, &roce(opcode::CNP, 16)));
        assert!(!matches(&c, &roce(opcode::WRITE_ONLY, 4)));
        assert!(!matches(&c, &ClassFields { roce: None, dscp: 26 }));
    }

    #[test]
    fn payload_bound_picks_small_messages() {
        let mut cts =
            ClassEntry { flags: CLASS_MATCH_OPCODE | CLASS_MATCH_PAYLOAD, max_payload: 4, ..Default::default() };
        add_opcode(&mut cts.opcodes, opcode::WRITE_ONLY_IMM);
        assert!(matches(&cts, &roce(opcode::WRITE_ONLY_IMM, 4)));
        assert!(!matches(&cts, &roce(opcode::WRITE_ONLY_IMM, 4096)));
    }

    #[test]
    fn qp_range_and_dscp() {
        let c = ClassEntry {
            flags: CLASS_MATCH_QP | CLASS_MATCH_DSCP,
            qp_min: 0x100,
            qp_max: 0x1FF,
            dscps: 1 << 26,
            ..Default::default()
        };
        assert!(matches(&c, &roce(opcode::SEND_ONLY, 0)));
        let mut other_qp = roce(opcode::SEND_ONLY, 0);
        other_qp.roce.as_mut().unwrap().dest_qp = 0x200;
        assert!(!matches(&c, &other_qp));
        assert!(!matches(&c, &ClassFields { dscp: 48, ..roce(opcode::SEND_ONLY, 0) }));
    }

    #[test]
    fn empty_class_matches_everything() {
        assert!(matches(&ClassEntry::default(), &ClassFields { roce: None, dscp: 0 }));
    }
}
