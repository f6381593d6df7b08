//! Property tests over rocev2-common's pure decision code (issue 6).
//!
//! The crate is `no_std`; its integration tests link std. Case counts are
//! bounded (512, or 256 for the costlier ones) so CI stays fast; set
//! PROPTEST_CASES to run more locally.

use proptest::prelude::*;
use rocev2_common::{
    bth::{self, Bth, BTH_LEN},
    buckets,
    checksum::{internet_checksum, update_u16},
    class::{self, ClassEntry, ClassFields, RoceFields},
    ecn::{self, EcnProfile},
    flowlet::{self, FlowletDecision, FlowletEntry},
    hash::{member_hash, pick_member, FlowKey, HashMode, HashVersion},
};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, ..ProptestConfig::default() }
}

fn arb_key() -> impl Strategy<Value = FlowKey> {
    (any::<bool>(), any::<[u8; 16]>(), any::<[u8; 16]>(), any::<u8>(), any::<u16>(), any::<u16>(), any::<u32>())
        .prop_map(|(v6, s, d, proto, sp, dp, qp)| {
            let key = if v6 {
                FlowKey::v6(s, d, proto, sp, dp)
            } else {
                FlowKey::v4(s[..4].try_into().unwrap(), d[..4].try_into().unwrap(), proto, sp, dp)
            };
            key.with_dest_qp(qp)
        })
}

fn arb_mode() -> impl Strategy<Value = HashMode> {
    prop_oneof![Just(HashMode::Qp), Just(HashMode::FiveTuple)]
}

fn arb_version() -> impl Strategy<Value = HashVersion> {
    prop_oneof![Just(HashVersion::V1), Just(HashVersion::V2)]
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn pick_member_is_in_range(hash in any::<u32>(), count in 1u32..=u32::MAX) {
        prop_assert!(pick_member(hash, count) < count);
    }

    #[test]
    fn pick_member_is_monotonic_in_the_hash(a in any::<u32>(), b in any::<u32>(), count in 1u32..=128) {
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        prop_assert!(pick_member(lo, count) <= pick_member(hi, count));
    }

    #[test]
    fn member_of_a_real_group_is_in_range(key in arb_key(), mode in arb_mode(), seed in any::<u32>(), count in 1u32..=128, version in arb_version()) {
        prop_assert!(pick_member(member_hash(&key, mode, seed, version), count) < count);
    }

    #[test]
    fn five_tuple_mode_ignores_the_dest_qp(key in arb_key(), other_qp in any::<u32>(), seed in any::<u32>(), version in arb_version()) {
        let other = key.with_dest_qp(other_qp);
        prop_assert_eq!(member_hash(&key, HashMode::FiveTuple, seed, version), member_hash(&other, HashMode::FiveTuple, seed, version));
        // ... and equals the qp-mode hash with DestQP 0.
        prop_assert_eq!(member_hash(&key, HashMode::FiveTuple, seed, version), member_hash(&key.with_dest_qp(0), HashMode::Qp, seed, version));
    }

    #[test]
    fn with_dest_qp_keeps_24_bits(key in arb_key(), qp in any::<u32>(), seed in any::<u32>(), version in arb_version()) {
        let a = key.with_dest_qp(qp);
        let b = key.with_dest_qp(qp & 0x00FF_FFFF);
        prop_assert_eq!(a.dest_qp, qp & 0x00FF_FFFF);
        prop_assert_eq!(member_hash(&a, HashMode::Qp, seed, version), member_hash(&b, HashMode::Qp, seed, version));
    }

    #[test]
    fn hash_is_deterministic(key in arb_key(), mode in arb_mode(), seed in any::<u32>(), version in arb_version()) {
        let copy = key;
        prop_assert_eq!(member_hash(&key, mode, seed, version), member_hash(&copy, mode, seed, version));
    }

    #[test]
    fn bth_roundtrips(wire in any::<[u8; BTH_LEN]>()) {
        let b = Bth::parse(&wire);
        let back = b.to_bytes();
        // Everything the struct models survives; reserved/TVer bits are dropped.
        let mask: [u8; BTH_LEN] = [0xFF, 0xB0, 0xFF, 0xFF, 0xC0, 0xFF, 0xFF, 0xFF, 0x80, 0xFF, 0xFF, 0xFF];
        for i in 0..BTH_LEN {
            prop_assert_eq!(back[i], wire[i] & mask[i], "byte {}", i);
        }
        prop_assert_eq!(Bth::parse(&back), b);
        prop_assert_eq!(b.dest_qp, bth::dest_qp(&wire));
        prop_assert!(b.dest_qp <= 0xFF_FFFF && b.psn <= 0xFF_FFFF && b.pad_count <= 3);
    }

    #[test]
    fn ends_message_depends_on_the_operation_bits(op in any::<u8>()) {
        // Same operation in every transport class (RC/UC/RD/UD), CNP aside.
        if op != bth::opcode::CNP {
            prop_assert_eq!(bth::ends_message(op), bth::ends_message(op & 0x1F));
        }
    }

    #[test]
    fn flowlet_keep_is_always_a_valid_position(
        entry in proptest::option::of((any::<u64>(), any::<u32>(), any::<u32>(), 0u32..4, 0u32..2)),
        now in any::<u64>(), gap in any::<u64>(), generation in 0u32..4, count in 0u32..=130, boundary in any::<bool>(),
    ) {
        let e = entry.map(|(last_seen_ns, flowlet_id, position, g, at_boundary)| FlowletEntry {
            last_seen_ns, flowlet_id, position: position % 140, generation: g, at_boundary,
        });
        match flowlet::decide(e.as_ref(), now, gap, generation, count, boundary) {
            FlowletDecision::Keep { position } => {
                let e = e.unwrap();
                prop_assert!(position < count, "Keep {} with {} members", position, count);
                prop_assert_eq!(position, e.position);
                prop_assert_eq!(e.generation, generation);
            }
            FlowletDecision::NewFlowlet { flowlet_id } => match e {
                None => prop_assert_eq!(flowlet_id, 0),
                Some(e) => prop_assert_eq!(flowlet_id, e.flowlet_id.wrapping_add(1)),
            },
        }
    }

    #[test]
    fn flowlet_within_the_gap_keeps(last in 0u64..1 << 40, dt in 0u64..1_000_000, gap in 1_000_000u64..2_000_000,
                                    position in 0u32..8, boundary in any::<bool>(), at_boundary in 0u32..2) {
        let e = FlowletEntry { last_seen_ns: last, flowlet_id: 3, position, generation: 1, at_boundary };
        prop_assert_eq!(flowlet::decide(Some(&e), last + dt, gap, 1, 8, boundary), FlowletDecision::Keep { position });
    }

    #[test]
    fn rehash_position_in_range(key in arb_key(), seed in any::<u32>(), id in any::<u32>(), count in 1u32..=128) {
        prop_assert!(flowlet::rehash_position(&key, seed, id, &buckets::even_table(count)) < count);
    }

    #[test]
    fn drained_bytes_within_two_of_exact(ns in any::<u64>(), rate in 0u64..=ecn::MAX_RATE_BYTES_PER_SEC) {
        let got = ecn::drained_bytes(ns, rate);
        if ns / 1_000_000_000 >= 1 << 20 {
            prop_assert_eq!(got, u64::MAX);
        } else {
            let exact = u128::from(ns) * u128::from(rate) / 1_000_000_000;
            let exact = u64::try_from(exact).unwrap();
            prop_assert!(got <= exact && exact - got <= 2, "ns {} rate {}: {} vs {}", ns, rate, got, exact);
        }
    }

    #[test]
    fn drained_bytes_small_times(ns in 0u64..10_000_000_000, rate in 0u64..=ecn::MAX_RATE_BYTES_PER_SEC) {
        // The range a real queue sees: the exact value, to two bytes.
        let exact = (u128::from(ns) * u128::from(rate) / 1_000_000_000) as u64;
        let got = ecn::drained_bytes(ns, rate);
        prop_assert!(got <= exact && exact - got <= 2, "ns {} rate {}: {} vs {}", ns, rate, got, exact);
    }

    #[test]
    fn drain_rate_is_close_below_exact(ns in any::<u64>(), rate in 0u64..=u64::MAX) {
        // The per-packet multiplier: never above the exact value, and below
        // it by at most 1/2^23 of it plus one byte (the exact path's two
        // bytes beyond FAST_DRAIN_NS).
        let drain = ecn::DrainRate::new(rate);
        let got = drain.drained(ns);
        if ns >= ecn::FAST_DRAIN_NS {
            prop_assert_eq!(got, ecn::drained_bytes(ns, rate));
        } else {
            let rate = rate.min(ecn::MAX_RATE_BYTES_PER_SEC);
            let exact = u64::try_from(u128::from(ns) * u128::from(rate) / 1_000_000_000).unwrap();
            prop_assert!(got <= exact && exact - got <= (exact >> 23) + 1, "ns {} rate {}: {} vs {}", ns, rate, got, exact);
        }
    }

    #[test]
    fn drain_rate_small_times(ns in 0u64..10_000_000_000, rate in 0u64..=ecn::MAX_RATE_BYTES_PER_SEC) {
        let exact = (u128::from(ns) * u128::from(rate) / 1_000_000_000) as u64;
        let got = ecn::DrainRate::new(rate).drained(ns);
        prop_assert!(got <= exact && exact - got <= (exact >> 23) + 1, "ns {} rate {}: {} vs {}", ns, rate, got, exact);
    }

    #[test]
    fn drained_bytes_clamps_huge_rates(ns in 0u64..10_000_000_000, rate in ecn::MAX_RATE_BYTES_PER_SEC..=u64::MAX) {
        prop_assert_eq!(ecn::drained_bytes(ns, rate), ecn::drained_bytes(ns, ecn::MAX_RATE_BYTES_PER_SEC));
    }

    #[test]
    fn congestion_is_monotonic_in_depth(a in any::<u64>(), b in any::<u64>(), kmin in any::<u64>(), span in any::<u64>(),
                                        pmax in any::<u32>()) {
        let p = EcnProfile { kmin_bytes: kmin, kmax_bytes: kmin.saturating_add(span), pmax_scaled: pmax, flags: 0 };
        let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
        let level = |c: ecn::Congestion| match c {
            ecn::Congestion::None => 0u64,
            ecn::Congestion::Probabilistic(p) => 1 + u64::from(p),
            ecn::Congestion::Full => u64::MAX,
        };
        let (cl, ch) = (ecn::congestion(lo, &p), ecn::congestion(hi, &p));
        prop_assert!(level(cl) <= level(ch), "{:?} at {} > {:?} at {} ({:?})", cl, lo, ch, hi, p);
        if let ecn::Congestion::Probabilistic(q) = cl {
            prop_assert!(q <= pmax);
        }
        // Probability never exceeds the chance of marking at kmax.
        for r in [0u32, pmax, u32::MAX] {
            prop_assert!(!ecn::should_mark(cl, r) || ecn::should_mark(ch, r));
        }
    }

    #[test]
    fn enqueue_never_loses_the_new_packet(depth in 0u64..1 << 40, last in 0u64..1 << 50, dt in 0u64..1 << 34,
                                          len in 0u64..65536, rate in 1u64..=ecn::MAX_RATE_BYTES_PER_SEC) {
        let q = ecn::VirtualQueue { depth_bytes: depth, last_update_ns: last, high_water_bytes: depth };
        let q2 = ecn::enqueue(&q, last + dt, len, &ecn::DrainRate::new(rate));
        prop_assert!(q2.depth_bytes >= len && q2.depth_bytes <= depth + len);
        prop_assert!(q2.high_water_bytes >= q2.depth_bytes && q2.high_water_bytes >= depth);
        prop_assert_eq!(q2.last_update_ns, last + dt);
    }

    #[test]
    fn checksum_update_matches_recompute(mut words in proptest::collection::vec(any::<u16>(), 10..=30),
                                         at in any::<prop::sample::Index>(), new in any::<u16>()) {
        // A random header of 10..30 words with a valid checksum in word 5.
        // Word 0 holds version 4 / IHL: a header never sums to zero, the one
        // case where RFC 1624 gives +0 and only -0 would verify.
        words[0] = 0x4500 | (words[0] & 0xFF);
        words[5] = 0;
        let bytes = |w: &[u16]| w.iter().flat_map(|x| x.to_be_bytes()).collect::<Vec<u8>>();
        words[5] = internet_checksum(&bytes(&words));
        prop_assert_eq!(internet_checksum(&bytes(&words)), 0);
        let i = at.index(words.len());
        prop_assume!(i != 0 && i != 5);
        let old = words[i];
        let patched = update_u16(words[5], old, new);
        words[i] = new;
        // The patched header still verifies ...
        words[5] = patched;
        prop_assert_eq!(internet_checksum(&bytes(&words)), 0, "word {} {:#06x} -> {:#06x}", i, old, new);
        // ... and equals a full recompute, except that ones' complement has
        // two zeros: RFC 1624 may give 0xFFFF where a recompute gives 0x0000
        // (only possible when all other words sum to zero).
        words[5] = 0;
        let full = internet_checksum(&bytes(&words));
        prop_assert!(patched == full || (patched, full) == (0xFFFF, 0x0000) || (patched, full) == (0x0000, 0xFFFF),
                     "patched {:#06x} full {:#06x}", patched, full);
    }

    #[test]
    fn ttl_decrement_on_random_ipv4_headers(hdr in any::<[u8; 20]>(), ttl in 2u8..=255) {
        let mut h = hdr;
        h[0] = 0x45;
        h[8] = ttl;
        h[10..12].fill(0);
        let c = internet_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        let check = update_u16(c, u16::from_be_bytes([ttl, h[9]]), u16::from_be_bytes([ttl - 1, h[9]]));
        h[8] = ttl - 1;
        h[10..12].copy_from_slice(&check.to_be_bytes());
        prop_assert_eq!(internet_checksum(&h), 0);
        let mut r = h;
        r[10..12].fill(0);
        prop_assert_eq!(check, internet_checksum(&r));
    }

    #[test]
    fn class_matches_agrees_with_a_plain_reimplementation(
        opcodes in any::<[u64; 4]>(), dscps in any::<u64>(), qp_a in 0u32..0x100_0000, qp_b in 0u32..0x100_0000,
        max_payload in any::<u32>(), flags in any::<u32>(),
        roce in proptest::option::of((any::<u8>(), 0u32..0x100_0000, any::<u32>())), dscp in 0u8..64,
    ) {
        let c = ClassEntry {
            opcodes, dscps, qp_min: qp_a.min(qp_b), qp_max: qp_a.max(qp_b), max_payload, flags, ..Default::default()
        };
        let f = ClassFields {
            roce: roce.map(|(opcode, dest_qp, payload_len)| RoceFields { opcode, dest_qp, payload_len }),
            dscp,
        };
        prop_assert_eq!(class::matches(&c, &f), reference_matches(&c, &f));
    }

    #[test]
    fn add_opcode_sets_exactly_one_matching_bit(op in any::<u8>(), other in any::<u8>()) {
        let mut map = [0u64; 4];
        class::add_opcode(&mut map, op);
        let c = ClassEntry { opcodes: map, flags: class::CLASS_MATCH_OPCODE, ..Default::default() };
        let fields = |opcode| ClassFields { roce: Some(RoceFields { opcode, dest_qp: 0, payload_len: 0 }), dscp: 0 };
        prop_assert!(class::matches(&c, &fields(op)));
        prop_assert_eq!(class::matches(&c, &fields(other)), other == op);
    }
}

/// `class::matches` written the obvious way: a set of opcodes, a set of
/// DSCPs, an inclusive QP range, a payload bound; each only if its flag is set.
fn reference_matches(c: &ClassEntry, f: &ClassFields) -> bool {
    let opcode_set: Vec<u8> =
        (0..=255u8).filter(|o| c.opcodes[usize::from(*o) / 64] & (1u64 << (o % 64)) != 0).collect();
    let dscp_set: Vec<u8> = (0..64u8).filter(|d| c.dscps & (1u64 << d) != 0).collect();
    if c.flags & class::CLASS_MATCH_DSCP != 0 && !dscp_set.contains(&f.dscp) {
        return false;
    }
    let roce_match = class::CLASS_MATCH_OPCODE | class::CLASS_MATCH_QP | class::CLASS_MATCH_PAYLOAD;
    if c.flags & roce_match == 0 {
        return true;
    }
    let Some(r) = f.roce else { return false };
    (c.flags & class::CLASS_MATCH_OPCODE == 0 || opcode_set.contains(&r.opcode))
        && (c.flags & class::CLASS_MATCH_QP == 0 || (c.qp_min..=c.qp_max).contains(&r.dest_qp))
        && (c.flags & class::CLASS_MATCH_PAYLOAD == 0 || r.payload_len <= c.max_payload)
}

proptest! {
    /// Whatever the weights and whichever members leave, a bucket whose
    /// member stays usable never moves, and every share is exact.
    #[test]
    fn rebalance_moves_only_departed_members_buckets(
        weights in proptest::collection::vec(1u32..=8, 1..=16),
        gone in proptest::collection::vec(any::<bool>(), 16),
    ) {
        let mut table = [0u8; 256];
        buckets::fill(&weights, &mut table);
        let before = table;
        let after_weights: Vec<u32> = weights.iter().zip(&gone).map(|(w, g)| if *g { 0 } else { *w }).collect();
        buckets::rebalance(&mut table, &after_weights, buckets::Rebalance::Gradual(0));
        for (b, a) in before.iter().zip(&table) {
            if after_weights[usize::from(*b)] > 0 {
                prop_assert_eq!(b, a);
            }
        }
        if after_weights.iter().any(|w| *w > 0) {
            prop_assert!(table.iter().all(|m| after_weights[usize::from(*m)] > 0));
        }
    }
}
