//! The flow hash: one function for the XDP program, the control program's
//! predictions (`rocev2 explain`), the entropy simulator and the tests.
//!
//! It is MurmurHash3 (x86, 32-bit) over a fixed 11-word key with a
//! configurable seed. A fixed-length key keeps the eBPF code loop-free after
//! unrolling and lets the verifier see a constant instruction count.

/// How a group chooses its member. Stored as `u32` in [`crate::maps::GroupEntry`].
/// Its text form ([`HashMode::name`]) is the one for configs, flags
/// (clap's `ValueEnum`), JSON (serde), `stats`, metrics and `explain`.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(clap::ValueEnum, serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "user", serde(rename_all = "kebab-case"))]
pub enum HashMode {
    /// Source and destination address, IP protocol, source and destination port.
    FiveTuple = 0,
    /// Five-tuple plus the BTH destination QP for RoCEv2 packets (Meta's E-ECMP).
    /// Non-RoCE packets hash on the five-tuple only.
    Qp = 1,
}

impl HashMode {
    /// The name in configs, `stats`, metrics and `explain`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::FiveTuple => "five-tuple",
            Self::Qp => "qp",
        }
    }

    pub const ALL: [HashMode; 2] = [Self::FiveTuple, Self::Qp];

    /// The mode a config names (`"qp"` or `"five-tuple"`).
    pub fn from_name(name: &str) -> Option<Self> {
        name.parse().ok()
    }

    #[inline(always)]
    pub fn from_u32(v: u32) -> Option<Self> {
        match v {
            0 => Some(Self::FiveTuple),
            1 => Some(Self::Qp),
            _ => None,
        }
    }
}

crate::text_form!(HashMode, UnknownHashMode, "use \"qp\" (five-tuple plus RoCEv2 destination QP) or \"five-tuple\"");

/// What identifies a flow. Addresses are kept as four 32-bit words made
/// from the wire bytes with `u32::from_le_bytes` (a plain load on the
/// little-endian BPF target); IPv4 uses word 0 and leaves the rest zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowKey {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    pub src_port: u16,
    pub dst_port: u16,
    pub protocol: u8,
    /// BTH destination QP for RoCEv2 packets, 0 otherwise.
    pub dest_qp: u32,
}

#[inline(always)]
fn word(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// An IPv4 address as the four words a FlowKey (and the route cache) keeps:
/// word 0, the rest zero.
#[inline(always)]
pub fn ipv4_words(a: [u8; 4]) -> [u32; 4] {
    [word(&a, 0), 0, 0, 0]
}

/// An IPv6 address as the four words a FlowKey (and the route cache) keeps.
#[inline(always)]
pub fn ipv6_words(a: &[u8; 16]) -> [u32; 4] {
    [ipv6_word(a, 0), ipv6_word(a, 1), ipv6_word(a, 2), ipv6_word(a, 3)]
}

/// Word `i` (0 to 3) of [`ipv6_words`], read alone (the eBPF program writes
/// a key word by word, without a copy of the address on its stack).
#[inline(always)]
pub fn ipv6_word(a: &[u8; 16], i: usize) -> u32 {
    word(a, 4 * i)
}

impl FlowKey {
    pub fn v4(src: [u8; 4], dst: [u8; 4], protocol: u8, src_port: u16, dst_port: u16) -> Self {
        Self { src: ipv4_words(src), dst: ipv4_words(dst), src_port, dst_port, protocol, dest_qp: 0 }
    }

    pub fn v6(src: [u8; 16], dst: [u8; 16], protocol: u8, src_port: u16, dst_port: u16) -> Self {
        Self::v6_ref(&src, &dst, protocol, src_port, dst_port)
    }

    /// Like [`FlowKey::v6`] without copying the addresses (the eBPF program
    /// reads them straight from the packet; its stack is small).
    #[inline(always)]
    pub fn v6_ref(src: &[u8; 16], dst: &[u8; 16], protocol: u8, src_port: u16, dst_port: u16) -> Self {
        Self { src: ipv6_words(src), dst: ipv6_words(dst), src_port, dst_port, protocol, dest_qp: 0 }
    }

    pub fn with_dest_qp(mut self, dest_qp: u32) -> Self {
        self.dest_qp = dest_qp & 0x00FF_FFFF;
        self
    }
}

const C1: u32 = 0xcc9e_2d51;
const C2: u32 = 0x1b87_3593;

#[inline(always)]
fn mix(h: u32, k: u32) -> u32 {
    let k = k.wrapping_mul(C1).rotate_left(15).wrapping_mul(C2);
    (h ^ k).rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64)
}

#[inline(always)]
fn finalize(mut h: u32, len_bytes: u32) -> u32 {
    h ^= len_bytes;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// MurmurHash3 over the key's 11 words.
#[inline(always)]
pub fn flow_hash(key: &FlowKey, seed: u32) -> u32 {
    hash_with_qp(key, key.dest_qp, seed)
}

/// The hash of `key` with `dest_qp` in place of its own (no copy of the
/// key: the eBPF stack is small).
#[inline(always)]
fn hash_with_qp(key: &FlowKey, dest_qp: u32, seed: u32) -> u32 {
    finalize(mix_key(key, dest_qp, seed), KEY_BYTES)
}

/// The key's length as MurmurHash3 counts it: 11 words.
const KEY_BYTES: u32 = 44;

/// MurmurHash3's pass over the key's 11 words (with `dest_qp` as the last),
/// before the finalization. The one place the key is mixed.
#[inline(always)]
fn mix_key(key: &FlowKey, dest_qp: u32, seed: u32) -> u32 {
    let mut h = seed;
    h = mix(h, key.src[0]);
    h = mix(h, key.src[1]);
    h = mix(h, key.src[2]);
    h = mix(h, key.src[3]);
    h = mix(h, key.dst[0]);
    h = mix(h, key.dst[1]);
    h = mix(h, key.dst[2]);
    h = mix(h, key.dst[3]);
    h = mix(h, (u32::from(key.src_port) << 16) | u32::from(key.dst_port));
    h = mix(h, u32::from(key.protocol));
    mix(h, dest_qp)
}

/// The flow key mixed once under a seed, for a caller that needs two
/// hashes of one flow (the keyless flowlet table's slot and tag): one pass
/// over the 11 words, then two finalizations of the 32-bit state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MixedKey(u32);

/// Xored into the state before [`MixedKey::second`]'s finalization. Any
/// constant with many bits set would do: it makes the second value a
/// different bijection of the state than the first.
const SECOND_SALT: u32 = 0x9e37_79b9;

impl MixedKey {
    /// The whole key, DestQP included, mixed under `seed`.
    #[inline(always)]
    pub fn new(key: &FlowKey, seed: u32) -> Self {
        Self(mix_key(key, key.dest_qp, seed))
    }

    /// MurmurHash3's own finalization: the same value as
    /// [`flow_hash`]`(key, seed)`.
    #[inline(always)]
    pub fn first(self) -> u32 {
        finalize(self.0, KEY_BYTES)
    }

    /// A second finalization, of the state xored with a constant. Both are
    /// bijections of one 32-bit state, so two flows share both values only
    /// when they share the state; otherwise the avalanche of the
    /// finalization makes the second value look independent of the first.
    #[inline(always)]
    pub fn second(self) -> u32 {
        finalize(self.0 ^ SECOND_SALT, KEY_BYTES)
    }
}

/// The hash a group in `mode` uses for this key: the DestQP only counts in
/// [`HashMode::Qp`] (and is 0 for non-RoCE packets anyway).
#[inline(always)]
pub fn member_hash(key: &FlowKey, mode: HashMode, seed: u32) -> u32 {
    match mode {
        HashMode::Qp => flow_hash(key, seed),
        HashMode::FiveTuple => hash_with_qp(key, 0, seed),
    }
}

/// One step of [`mix`] for a zero word: a zero word scrambles to zero, so
/// only the rotate, multiply and add are left.
#[inline(always)]
fn mix_zero(h: u32) -> u32 {
    h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64)
}

/// [`member_hash`] of an IPv4 key, the same value with fewer instructions:
/// its address words 1 to 3 are zero ([`ipv4_words`]), so their six steps
/// skip the scramble. The XDP program's IPv4 path uses it; a key with any
/// of those words set would hash differently, so only IPv4 keys may come
/// here.
#[inline(always)]
pub fn member_hash_v4(key: &FlowKey, mode: HashMode, seed: u32) -> u32 {
    let dest_qp = match mode {
        HashMode::Qp => key.dest_qp,
        HashMode::FiveTuple => 0,
    };
    let mut h = mix(seed, key.src[0]);
    h = mix_zero(mix_zero(mix_zero(h)));
    h = mix(h, key.dst[0]);
    h = mix_zero(mix_zero(mix_zero(h)));
    h = mix(h, (u32::from(key.src_port) << 16) | u32::from(key.dst_port));
    h = mix(h, u32::from(key.protocol));
    h = mix(h, dest_qp);
    finalize(h, KEY_BYTES)
}

/// The seed `hash_seed = "auto"` gives: MurmurHash3's mixing over the
/// box's port MAC addresses (in any order: the smallest first). MAC
/// addresses are unique per box and stable across restarts, so each switch
/// of a fabric gets its own seed, and keeps it. Never 0, so an auto seed
/// is never mistaken for the default.
pub fn auto_seed(macs: impl IntoIterator<Item = [u8; 6]>) -> u32 {
    let mut sorted = [[0u8; 6]; 64];
    let mut n = 0;
    for mac in macs {
        if n < sorted.len() && mac != [0; 6] {
            sorted[n] = mac;
            n += 1;
        }
    }
    sorted[..n].sort_unstable();
    let mut h = 0x5eed_u32;
    for mac in &sorted[..n] {
        h = mix(h, u32::from_le_bytes([mac[0], mac[1], mac[2], mac[3]]));
        h = mix(h, u32::from(mac[4]) | (u32::from(mac[5]) << 8));
    }
    finalize(h, (n * 6) as u32).max(1)
}

/// Maps a hash onto `0..count` without division (Lemire's multiply-shift):
/// uniform for a uniform hash, and cheap in eBPF. `count` must be non-zero.
#[inline(always)]
pub fn pick_member(hash: u32, count: u32) -> u32 {
    ((u64::from(hash) * u64::from(count)) >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ipv4_hash_equals_the_general_one_for_every_ipv4_key() {
        let mut rng = 0x1234_5678_u64;
        for _ in 0..20_000 {
            let r = crate::rng::splitmix64(&mut rng);
            let q = crate::rng::splitmix64(&mut rng);
            let key = FlowKey::v4((r as u32).to_be_bytes(), ((r >> 32) as u32).to_be_bytes(), 17, q as u16, 4791)
                .with_dest_qp((q >> 16) as u32);
            let seed = (q >> 40) as u32;
            for mode in HashMode::ALL {
                assert_eq!(member_hash_v4(&key, mode, seed), member_hash(&key, mode, seed), "{key:?} {mode:?}");
            }
        }
    }

    #[test]
    fn hash_mode_text_round_trips() {
        use std::string::ToString as _;
        for mode in [HashMode::FiveTuple, HashMode::Qp] {
            assert_eq!(mode.to_string().parse::<HashMode>(), Ok(mode));
        }
        assert_eq!("ecmp".parse::<HashMode>(), Err(UnknownHashMode));
    }

    fn roce_key(qp: u32) -> FlowKey {
        FlowKey::v4([10, 0, 0, 1], [10, 1, 0, 1], 17, 0xC123, 4791).with_dest_qp(qp)
    }

    #[test]
    fn known_value_is_stable() {
        // The reference MurmurHash3_x86_32 of the key's 44 little-endian
        // bytes, from Python's `mmh3.hash(data, 0, signed=False)`. Pinned so
        // a change of the hash (which reshuffles every flow of a running
        // fabric) is a deliberate, visible decision.
        assert_eq!(flow_hash(&roce_key(0x11), 0), 35_776_012);
    }

    #[test]
    fn spreads_evenly_over_64_members() {
        let mut load = [0u32; 64];
        let flows = 64 * 1000;
        for i in 0..flows {
            let key = FlowKey::v4([10, 0, (i >> 8) as u8, i as u8], [10, 1, 0, 1], 17, 0xC000, 4791).with_dest_qp(i);
            load[pick_member(member_hash(&key, HashMode::Qp, 7), 64) as usize] += 1;
        }
        let (min, max) = (load.iter().min().unwrap(), load.iter().max().unwrap());
        // 1000 expected per member; 4 standard deviations is about +-126.
        assert!(*min > 850 && *max < 1150, "min {min} max {max}");
    }

    #[test]
    fn mixed_key_first_is_the_flow_hash() {
        for qp in 0..100 {
            let key = roce_key(qp);
            assert_eq!(MixedKey::new(&key, qp * 7).first(), flow_hash(&key, qp * 7));
        }
    }

    #[test]
    fn seed_changes_the_hash() {
        let key = roce_key(5);
        let differing = (0..100).filter(|s| flow_hash(&key, *s) != flow_hash(&key, s + 1)).count();
        assert_eq!(differing, 100);
    }

    #[test]
    fn dest_qp_counts_only_in_qp_mode() {
        let (a, b) = (roce_key(1), roce_key(2));
        assert_ne!(member_hash(&a, HashMode::Qp, 9), member_hash(&b, HashMode::Qp, 9));
        assert_eq!(member_hash(&a, HashMode::FiveTuple, 9), member_hash(&b, HashMode::FiveTuple, 9));
    }

    #[test]
    fn qp_mode_spreads_one_source_port_over_uplinks() {
        // 64 QPs between two hosts, one UDP source port: the case Meta saw.
        let mut used = [false; 4];
        for qp in 0..64 {
            used[pick_member(member_hash(&roce_key(0x100 + qp), HashMode::Qp, 1), 4) as usize] = true;
        }
        assert_eq!(used, [true; 4]);
    }

    #[test]
    fn auto_seed_depends_on_the_set_of_macs_only() {
        let a = [2, 0, 0, 0, 0, 1];
        let b = [2, 0, 0, 0, 0, 2];
        assert_eq!(auto_seed([a, b]), auto_seed([b, a]));
        assert_ne!(auto_seed([a, b]), auto_seed([a]));
        assert_ne!(auto_seed([a]), auto_seed([b]));
        assert_ne!(auto_seed([]), 0);
    }

    #[test]
    fn pick_member_stays_in_range() {
        for count in 1..=128 {
            for hash in [0, 1, u32::MAX / 2, u32::MAX - 1, u32::MAX] {
                assert!(pick_member(hash, count) < count);
            }
        }
    }

    #[test]
    fn ipv6_words_all_count() {
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        let mut b = a;
        b[15] = 1;
        let ka = FlowKey::v6(a, [0; 16], 17, 1, 4791);
        let kb = FlowKey::v6(b, [0; 16], 17, 1, 4791);
        assert_ne!(flow_hash(&ka, 0), flow_hash(&kb, 0));
    }
}
