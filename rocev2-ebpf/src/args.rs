//! Typed argument packing for BPF subprograms, which take at most five
//! arguments in registers: two u32 values travel in one u64, named.

/// Declares `$name`, a u64 holding two named u32 fields (`$hi` in the
/// upper half), with `new` and one accessor per field.
macro_rules! packed_pair {
    ($(#[$doc:meta])* $name:ident { $hi:ident, $lo:ident }) => {
        $(#[$doc])*
        #[derive(Clone, Copy)]
        #[repr(transparent)]
        pub struct $name(u64);

        impl $name {
            #[inline(always)]
            pub fn new($hi: u32, $lo: u32) -> Self {
                Self((u64::from($hi) << 32) | u64::from($lo))
            }

            #[inline(always)]
            pub fn $hi(self) -> u32 {
                (self.0 >> 32) as u32
            }

            #[inline(always)]
            pub fn $lo(self) -> u32 {
                self.0 as u32
            }
        }
    };
}

packed_pair!(
    /// The ingress port's counter slot and the route's group.
    SlotGroup { slot, group }
);

packed_pair!(
    /// Whether the packet ends an RDMA message (0 or 1), and the pinned
    /// position or [`crate::pin::NO_PIN`].
    BoundaryPin { ends_message, pin }
);

packed_pair!(
    /// Whether the packet ends an RDMA message (0 or 1), and the hash seed.
    BoundarySeed { ends_message, seed }
);

packed_pair!(
    /// A class's flags and ECN profile ([`rocev2_common::ecn::NO_PROFILE`]
    /// for none).
    ClassEcn { flags, profile }
);

packed_pair!(
    /// Where a bridged frame goes: an FDB entry's kind (FDB_PORT or
    /// FDB_UPLINK) and target (the port's ifindex or the group's slot).
    BridgeTarget { kind, id }
);
