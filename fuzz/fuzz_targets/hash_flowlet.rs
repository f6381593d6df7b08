//! Member choice: the hash, pick_member and the flowlet decision never pick
//! a position outside the group, and five-tuple mode ignores the DestQP.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocev2_common::{
    flowlet::{decide, rehash_position, FlowletDecision, FlowletEntry},
    hash::{member_hash, pick_member, FlowKey, HashMode, HashVersion},
};

fn u32_at(d: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(d[i..i + 4].try_into().unwrap())
}
fn u64_at(d: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(d[i..i + 8].try_into().unwrap())
}

fuzz_target!(|d: &[u8]| {
    if d.len() < 96 {
        return;
    }
    let src: [u8; 16] = d[0..16].try_into().unwrap();
    let dst: [u8; 16] = d[16..32].try_into().unwrap();
    let (proto, sport, dport) = (d[32], u16::from_le_bytes([d[33], d[34]]), u16::from_le_bytes([d[35], d[36]]));
    let key = if d[37] & 1 == 0 {
        FlowKey::v4(src[..4].try_into().unwrap(), dst[..4].try_into().unwrap(), proto, sport, dport)
    } else {
        FlowKey::v6(src, dst, proto, sport, dport)
    }
    .with_dest_qp(u32_at(d, 38));
    let seed = u32_at(d, 42);
    let count = u32::from(d[46]) % 128 + 1;
    let other = key.with_dest_qp(u32_at(d, 47));
    for version in HashVersion::ALL {
        for mode in [HashMode::Qp, HashMode::FiveTuple] {
            assert!(pick_member(member_hash(&key, mode, seed, version), count) < count);
        }
        assert_eq!(
            member_hash(&key, HashMode::FiveTuple, seed, version),
            member_hash(&other, HashMode::FiveTuple, seed, version)
        );
    }
    assert!(pick_member(u32_at(d, 51), u32_at(d, 55).max(1)) < u32_at(d, 55).max(1));

    let entry = FlowletEntry {
        last_seen_ns: u64_at(d, 59),
        flowlet_id: u32_at(d, 67),
        position: u32_at(d, 71) % 256,
        generation: u32::from(d[75] & 3),
        at_boundary: u32::from(d[76] & 1),
    };
    let (now, gap, generation) = (u64_at(d, 77), u64_at(d, 85), u32::from(d[93] & 3));
    let members = u32::from(d[94]) % 130;
    let e = if d[95] & 2 == 0 { Some(&entry) } else { None };
    match decide(e, now, gap, generation, members, d[95] & 1 == 1) {
        FlowletDecision::Keep { position } => {
            assert!(position < members, "Keep {position} of {members}");
            assert_eq!(entry.generation, generation);
        }
        FlowletDecision::NewFlowlet { flowlet_id } => {
            let want = e.map_or(0, |e| e.flowlet_id.wrapping_add(1));
            assert_eq!(flowlet_id, want);
            assert!(rehash_position(&key, seed, flowlet_id, count) < count);
        }
    }
});
