//! What the pipeline hands on for a forwarded packet (`Forward`): the
//! stages after the member choice (counters, telemetry, the tc program)
//! read it, and forward.rs, which strings the stages together, writes it.
//! A module of its own so those stages need not import forward.rs.

use crate::parse::Roce;

/// A packet ready to leave: where to, and what to count.
#[derive(Clone, Copy)]
pub struct Forward {
    pub ifindex: u32,
    pub group: u32,
    pub position: u32,
    pub roce: Roce,
    /// skb priority for tc (0 = leave as is).
    pub priority: u32,
    /// The frame's length, as the IP parser measured it.
    pub len: u32,
    /// The TOS (IPv6: traffic class) byte sent: DSCP << 2 | ECN, after
    /// our own marking.
    pub tos: u8,
}
