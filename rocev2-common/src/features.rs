//! Pipeline features fixed when the programs are loaded.
//!
//! The control program derives the set from the config
//! ([`Features`] bits) and writes it into the eBPF object's `FEATURES`
//! constant before loading (aya's `EbpfLoader::override_global`). The
//! constant lives in the object's read-only data, which the kernel freezes,
//! so the verifier sees every feature test as a known value and removes
//! the code of features that are off: a config with no flowlet group, no
//! egress queue and no class runs a program as short as plain hashing.

/// Name of the load-time constant in the eBPF object.
pub const FEATURES_GLOBAL: &str = "FEATURES";

/// A set of pipeline features, one bit each.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Features(pub u32);

impl Features {
    /// Flowlet groups with the keyed table (`flowlet_table = "keyed"`, the
    /// default): the per-flow LRU table, its lookup, insert and decision.
    pub const FLOWLET_KEYED: Features = Features(1 << 0);
    /// Pinned groups: the per-(destination, DestQP) pin table.
    pub const PINNED: Features = Features(1 << 1);
    /// Egress virtual queues with ECN marking and per-egress counters.
    pub const ECN: Features = Features(1 << 2);
    /// Traffic classes: match, DSCP rewrite, skb priority, class counters.
    pub const CLASSES: Features = Features(1 << 3);
    /// Per-port and per-member packet and byte counters. Always on in
    /// `rocev2 run`; `rocev2 bench` turns it off to show what it costs.
    pub const COUNTERS: Features = Features(1 << 4);
    /// Per-QP transport telemetry (`telemetry_qps`) and `rocev2 trace`.
    pub const TELEMETRY: Features = Features(1 << 5);
    /// A transport-aware flowlet group's `repick = "idle-or-acked"`: an ACK
    /// of everything a QP sent ends its flowlet (in the telemetry's reply
    /// handling, so it needs TELEMETRY too).
    pub const ACKED_REPICK: Features = Features(1 << 6);
    /// Flowlet groups with the keyless table (`flowlet_table = "keyless"`):
    /// the hash-indexed slot array and its step.
    pub const FLOWLET_KEYLESS: Features = Features(1 << 7);
    /// Either flowlet table, for what both need (the flowlet clock). Two
    /// bits, not a feature of its own: the eBPF `enabled` test is true when
    /// either is loaded, as is [`Features::any_of`].
    pub const FLOWLET: Features = Self::FLOWLET_KEYED.with(Self::FLOWLET_KEYLESS);
    pub const NONE: Features = Features(0);
    /// What an object loaded without an override runs with.
    pub const ALL: Features = Features(0xFF);

    /// Every feature with its name, in bit order.
    pub const NAMED: [(Features, &'static str); 8] = [
        (Self::FLOWLET_KEYED, "flowlet-keyed"),
        (Self::PINNED, "pinned"),
        (Self::ECN, "ecn"),
        (Self::CLASSES, "classes"),
        (Self::COUNTERS, "counters"),
        (Self::TELEMETRY, "telemetry"),
        (Self::ACKED_REPICK, "acked-repick"),
        (Self::FLOWLET_KEYLESS, "flowlet-keyless"),
    ];

    #[inline(always)]
    pub const fn contains(self, other: Features) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any feature of `other` is in `self`.
    #[inline(always)]
    pub const fn any_of(self, other: Features) -> bool {
        self.0 & other.0 != 0
    }

    #[inline(always)]
    pub const fn with(self, other: Features) -> Features {
        Features(self.0 | other.0)
    }

    #[inline(always)]
    pub const fn without(self, other: Features) -> Features {
        Features(self.0 & !other.0)
    }

    /// `other` if `on`, else nothing: for building a set from config tests.
    #[inline(always)]
    pub const fn when(on: bool, other: Features) -> Features {
        if on {
            other
        } else {
            Features::NONE
        }
    }

    /// The names of the features in `self`, in bit order.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Self::NAMED.into_iter().filter(move |(f, _)| self.contains(*f)).map(|(_, n)| n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_every_named_feature() {
        let union = Features::NAMED.iter().fold(Features::NONE, |acc, (f, _)| acc.with(*f));
        assert_eq!(union, Features::ALL);
        assert!(Features::ALL.contains(Features::ECN));
        assert!(!Features::NONE.contains(Features::ECN));
        assert!(Features::NONE.contains(Features::NONE));
    }

    #[test]
    fn names_follow_the_bits() {
        let set = Features::FLOWLET_KEYED.with(Features::CLASSES);
        let mut names = set.names();
        assert_eq!((names.next(), names.next(), names.next()), (Some("flowlet-keyed"), Some("classes"), None));
        assert_eq!(set.without(Features::FLOWLET_KEYED), Features::CLASSES);
    }

    #[test]
    fn flowlet_is_either_table() {
        for table in [Features::FLOWLET_KEYED, Features::FLOWLET_KEYLESS] {
            assert!(table.any_of(Features::FLOWLET) && !table.contains(Features::FLOWLET));
        }
        assert!(!Features::ALL.without(Features::FLOWLET).any_of(Features::FLOWLET));
        assert_eq!(Features::FLOWLET.names().count(), 2, "no name of its own");
    }
}
