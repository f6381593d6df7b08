//! Traffic classes: the first configured class a packet matches gives its
//! DSCP rewrite, skb priority and ECN treatment.

use rocev2_common::{
    class::{self, ClassAction, ClassFields, RoceFields, CLASS_SET_DSCP, CLASS_SET_PRIORITY, MAX_CLASSES},
    ecn::NO_PROFILE,
};

use crate::{
    counters,
    maps::{CLASSES, CONFIG},
    parse::Roce,
    rewrite,
};

/// Returned by [`classify_index`] when no class matches.
pub const NO_CLASS: u32 = u32::MAX;

/// The action of "no class": no flag set, so nothing changes. A plain
/// value rather than an Option: LLVM may leave the fields of a `None`
/// undefined, and the verifier rejects reads of undefined registers.
pub const NO_ACTION: ClassAction = ClassAction { flags: 0, set_dscp: 0, priority: 0, profile: NO_PROFILE };

/// What the class matcher reads from a packet.
#[inline(always)]
pub fn fields(roce: &Roce, dest_qp: u32, dscp: u8) -> ClassFields {
    ClassFields {
        roce: match *roce {
            Roce::Yes { opcode, payload_len, .. } => Some(RoceFields { opcode, dest_qp, payload_len }),
            _ => None,
        },
        dscp,
    }
}

/// Live classes (CONFIG's class_count).
#[inline(always)]
fn class_count() -> u32 {
    CONFIG.get(0).map_or(0, |c| c.class_count)
}

/// The first of the `count` live classes that matches, with its index.
#[inline(always)]
fn classify(fields: &ClassFields, count: u32) -> Option<(u32, ClassAction)> {
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
pub fn classify_index(fields: &ClassFields, count: u32) -> u32 {
    classify(fields, count).map_or(NO_CLASS, |(i, _)| i)
}

/// The matching class's action, counted against the class; NO_ACTION
/// when none matches. A config without classes (the feature loaded, the
/// table empty) makes no call: a BPF-to-BPF call and its return cost
/// several ns here.
#[inline(always)]
pub fn matched(fields: &ClassFields, len: u64) -> ClassAction {
    let count = class_count();
    if count == 0 {
        return NO_ACTION;
    }
    match classify_index(fields, count) {
        NO_CLASS => NO_ACTION,
        index => {
            counters::class_matched(index, len);
            CLASSES.get(index).map_or(NO_ACTION, |c| c.action())
        }
    }
}

/// `tos` after the class's DSCP rewrite, if it has one.
#[inline(always)]
pub fn apply_dscp(class: &ClassAction, tos: u8) -> u8 {
    if class.flags & CLASS_SET_DSCP != 0 {
        rewrite::with_dscp(tos, class.set_dscp as u8)
    } else {
        tos
    }
}

/// The skb priority the class asks for (0 = leave as is).
#[inline(always)]
pub fn priority(class: &ClassAction) -> u32 {
    if class.flags & CLASS_SET_PRIORITY != 0 {
        class.priority
    } else {
        0
    }
}
