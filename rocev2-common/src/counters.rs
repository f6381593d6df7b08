//! Per-port counters: one per-CPU array of [`PortCounters`] blocks (and of
//! [`EgressCounters`] for egress ports) indexed by slot, each holding every counter below.
//!
//! Every packet the XDP program sees lands in `RxPackets` and in exactly one
//! outcome counter: a `Forwarded*`, a `Pass*` (handed to the kernel stack) or
//! a `Drop*` counter, each named by its reason.

macro_rules! counters {
    ($enum:ident, $block:ident { $($variant:ident => $name:literal, $help:literal;)* }) => {
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $enum { $($variant,)* }

        /// Every counter of one port, as one per-CPU map value: the program
        /// finds them with one lookup per packet and adds in place.
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $block {
            pub counts: [u64; $enum::COUNT as usize],
        }

        impl Default for $block {
            fn default() -> Self {
                Self { counts: [0; $enum::COUNT as usize] }
            }
        }

        impl $block {
            #[inline(always)]
            pub fn get(&self, counter: $enum) -> u64 {
                self.counts[counter as usize]
            }

            #[inline(always)]
            pub fn add(&mut self, counter: $enum, value: u64) {
                self.counts[counter as usize] += value;
            }
        }

        impl $enum {
            pub const ALL: &'static [$enum] = &[$($enum::$variant,)*];
            pub const COUNT: u32 = Self::ALL.len() as u32;

            /// Stable snake_case name used in `rocev2 stats`, JSON and metrics.
            pub const fn name(self) -> &'static str {
                match self { $($enum::$variant => $name,)* }
            }

            /// One-line explanation for operators.
            pub const fn help(self) -> &'static str {
                match self { $($enum::$variant => $help,)* }
            }
        }
    };
}

counters! { PortCounter, PortCounters {
    RxPackets => "rx_packets", "frames seen by the XDP program";
    RxBytes => "rx_bytes", "bytes of frames seen by the XDP program";
    Forwarded => "forwarded", "frames handed to a group member's egress device (redirected, less those it refused: drop_egress_refused)";
    ForwardedBytes => "forwarded_bytes", "bytes redirected to a group member (those of refused frames included: the kernel does not say their size)";
    ForwardedRoce => "forwarded_roce", "redirected frames that were RoCEv2 (UDP 4791)";
    RoceShortBth => "roce_short_bth", "RoCEv2 frames too short for a BTH: forwarded on the five-tuple";
    PassNotIp => "pass_not_ip", "not IPv4/IPv6 (ARP, LLDP, ...): to the kernel";
    PassL2Multicast => "pass_l2_multicast", "multicast or broadcast destination MAC: to the kernel";
    PassStackedVlan => "pass_stacked_vlan", "more than one VLAN tag: to the kernel";
    PassNoRoute => "pass_no_route", "no route for the destination: to the kernel";
    PassLocal => "pass_local", "destination is one of this box's addresses: to the kernel";
    PassTtlExpired => "pass_ttl_expired", "TTL/hop limit 1 or 0: to the kernel, which sends ICMP";
    PassFragment => "pass_fragment", "IPv4 fragment: to the kernel";
    PassIpv4Options => "pass_ipv4_options", "IPv4 options (Record Route, Router Alert, ...): to the kernel, which processes them";
    PassIpv6ExtHeader => "pass_ipv6_ext_header", "IPv6 extension header: to the kernel";
    PassL4Truncated => "pass_l4_truncated", "TCP/UDP header cut short: to the kernel";
    PassNoMember => "pass_no_member", "route's group has no usable member: to the kernel";
    PassKernelRoute => "pass_kernel_route", "a learned kernel route rocev2 leaves to the kernel (blackhole/unreachable, encapsulation, a device XDP cannot send to, a connected subnet's unknown host)";
    DropRunt => "drop_runt", "frame shorter than its Ethernet/VLAN header";
    DropBadIpHeader => "drop_bad_ip_header", "IP header truncated, bad version or length";
    DropBadIpv4Checksum => "drop_bad_ipv4_checksum", "IPv4 header checksum wrong on a packet to forward (the kernel drops these too)";
    DropRedirectFailed => "drop_redirect_failed", "egress device missing from the device map";
    DropEgressRefused => "drop_egress_refused", "redirected, then refused by the egress device after the XDP program returned (its ring was full, it was down, or a veth whose peer has no XDP/NAPI): counted from the kernel's xdp tracepoints";
    DropNotEct => "drop_not_ect", "Not-ECT packet above kmax with a drop_not_ect profile";
    FlowletNew => "flowlet_new", "packets that started a new flowlet (first packet of a flow included)";
    FlowletMoved => "flowlet_moved", "new flowlets that moved their flow to another member";
    FlowletInserted => "flowlet_inserted", "flows added to the flowlet table (evictions = inserted - live entries)";
    FlowletCollisions => "flowlet_collisions", "packets of a keyless flowlet table whose slot was live for another flow (they share its member)";
    PinHit => "pin_hit", "packets of a pinned group that followed a pin";
    PinFallback => "pin_fallback", "packets of a pinned group hashed instead (no pin, or the pinned member is down)";
    BridgedToPort => "bridged_to_port", "bridge mode: forwarded to the one port the FDB names (the other forwarded frames went to an uplink group member)";
    PassBridgeUnknownUnicast => "pass_bridge_unknown_unicast", "bridge mode: no FDB entry for the destination MAC: to the kernel bridge, which floods it";
    PassBridgeLocal => "pass_bridge_local", "bridge mode: to one of the bridge's own MACs: to the kernel";
    PassBridgeLearn => "pass_bridge_learn", "bridge mode: source MAC not in the FDB, or known on another port: to the kernel bridge, which learns it";
    PassBridgeSamePort => "pass_bridge_same_port", "bridge mode: the destination is on the port the frame came in on: to the kernel bridge (which drops it unless the port is in hairpin mode)";
    PassBridgePortBlocked => "pass_bridge_port_blocked", "bridge mode: arrived on a port that is not in STP forwarding state (or isolated, or locked): to the kernel bridge";
    PassBridgeEgressBlocked => "pass_bridge_egress_blocked", "bridge mode: the destination's port is not in STP forwarding state, down, isolated or locked: to the kernel bridge";
    PassBridgeMalformed => "pass_bridge_malformed", "bridge mode: a header rocev2 cannot read (a VLAN tag or IP header cut short, a bad IP version or length): to the kernel bridge, which forwards it as it would without rocev2";
}}

counters! { EgressCounter, EgressCounters {
    TxPackets => "tx_packets", "packets forwarded to this port";
    TxBytes => "tx_bytes", "bytes forwarded to this port";
    EctSeen => "ect_seen", "ECT(0)/ECT(1) packets seen by the marker";
    Marked => "ecn_marked", "packets marked CE";
    NotEctOverThreshold => "not_ect_over_threshold", "Not-ECT packets seen while the virtual queue was above kmin";
    Exempt => "ecn_exempt", "packets of a class exempt from marking";
}}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_indexes_dense() {
        for (i, c) in PortCounter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
            assert!(PortCounter::ALL[i + 1..].iter().all(|o| o.name() != c.name()));
        }
    }
}
