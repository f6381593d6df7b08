//! Traffic classes: the first configured class a packet matches gives its
//! DSCP rewrite, skb priority and ECN treatment.

use rocev2_common::class::{
    self, ClassAction, ClassFields, RoceFields, CLASS_SET_DSCP, CLASS_SET_PRIORITY, MAX_CLASSES,
};

use crate::{
    counters,
    maps::{CLASSES, CONFIG},
    parse::Roce,
    rewrite,
};

/// Returned by [`classify_index`] when no class matches.
pub const NO_CLASS: u32 = u32::MAX;

/// What the class matcher reads from a packet.
#[inline(always)]
pub fn fields(roce: &Roce, dscp: u8) -> ClassFields {
    ClassFields {
        roce: match *roce {
            Roce::Yes { opcode, dest_qp, payload_len } => Some(RoceFields { opcode, dest_qp, payload_len }),
            _ => None,
        },
        dscp,
    }
}

/// The first class that matches, with its index.
#[inline(always)]
pub fn classify(fields: &ClassFields) -> Option<(u32, ClassAction)> {
    let count = CONFIG.get(0).map_or(0, |c| c.class_count);
    for i in 0..MAX_CLASSES {
        if i >= count {
            break;
        }
        let Some(c) = CLASSES.get(i) else { break };
        if class::matches(c, fields) {
            return Some((i, c.action()));
        }
    }
    None
}

/// [`classify`] as its own BPF function (keeps the class loop's state out
/// of the caller's stack frame); returns the class index or NO_CLASS.
#[inline(never)]
pub fn classify_index(fields: &ClassFields) -> u32 {
    classify(fields).map_or(NO_CLASS, |(i, _)| i)
}

/// The matching class's action, counted against the class.
#[inline(always)]
pub fn matched(fields: &ClassFields, len: u64) -> Option<ClassAction> {
    match classify_index(fields) {
        NO_CLASS => None,
        index => {
            counters::class_matched(index, len);
            CLASSES.get(index).map(|c| c.action())
        }
    }
}

/// `tos` after the class's DSCP rewrite, if it has one.
#[inline(always)]
pub fn apply_dscp(class: &Option<ClassAction>, tos: u8) -> u8 {
    match class {
        Some(c) if c.flags & CLASS_SET_DSCP != 0 => rewrite::with_dscp(tos, c.set_dscp as u8),
        _ => tos,
    }
}

/// The skb priority the class asks for (0 = leave as is).
#[inline(always)]
pub fn priority(class: &Option<ClassAction>) -> u32 {
    match class {
        Some(c) if c.flags & CLASS_SET_PRIORITY != 0 => c.priority,
        _ => 0,
    }
}
