//! The flow hash: one function for the XDP program, the control program's
//! predictions (`rocev2 explain`), the entropy simulator and the tests.
//!
//! It is MurmurHash3 (x86, 32-bit) with a configurable seed, in two
//! versions ([`HashVersion`], `[dataplane] hash_version`): version 1 over a
//! fixed 11-word key (an IPv4 key's address words 1 to 3 are zero, hashed
//! all the same), version 2 over the words the key's family carries (4 for
//! IPv4, 10 for IPv6). Both are loop-free, fixed-length code per family, so
//! the verifier sees a constant instruction count.

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

/// Which flow hash a box runs (`[dataplane] hash_version`). Another
/// version places flows on other members, as another seed does: a fabric
/// keeps the version its switches were configured with. Stored in
/// [`crate::maps::DataplaneConfig::hash_version`] as its number.
#[repr(u32)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HashVersion {
    /// MurmurHash3 over a fixed 11-word key: source and destination as four
    /// words each (an IPv4 address's words 1 to 3 are zero and hashed too),
    /// ports, protocol, DestQP. The placement of every config written
    /// before `hash_version` existed, and of a config without the key.
    #[default]
    V1 = 1,
    /// MurmurHash3 over the words the family carries: source and
    /// destination address (1 word each for IPv4, 4 for IPv6), the two
    /// ports, and the protocol with the DestQP (`protocol << 24 | DestQP`):
    /// 4 words for IPv4, 10 for IPv6. What new configs use.
    V2 = 2,
}

impl HashVersion {
    pub const ALL: [HashVersion; 2] = [Self::V1, Self::V2];

    /// The number in configs, `explain` and CONFIG.
    #[inline(always)]
    pub const fn number(self) -> u32 {
        self as u32
    }

    /// The version a number names (1 or 2).
    pub fn from_number(n: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.number() == n)
    }

    /// The version a number names, or an error that says which do.
    pub fn parse_number(n: i64) -> Result<Self, UnknownHashVersion> {
        u32::try_from(n).ok().and_then(Self::from_number).ok_or(UnknownHashVersion)
    }

    /// The version CONFIG's `hash_version` field names: 2 is version 2;
    /// anything else is version 1, including the 0 of a CONFIG written
    /// before the field existed.
    #[inline(always)]
    pub fn from_config(n: u32) -> Self {
        if n == Self::V2 as u32 {
            Self::V2
        } else {
            Self::V1
        }
    }
}

/// A number that names no hash version; displays which do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownHashVersion;

impl core::fmt::Display for UnknownHashVersion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("use 2 (the hash over the words each family carries, for new configs) or 1 (the placement of configs written before hash_version existed)")
    }
}

#[cfg(feature = "user")]
impl std::error::Error for UnknownHashVersion {}

impl core::fmt::Display for HashVersion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}", self.number())
    }
}

impl core::str::FromStr for HashVersion {
    type Err = UnknownHashVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse::<i64>().map_err(|_| UnknownHashVersion).and_then(Self::parse_number)
    }
}

/// As its number, in JSON and state files.
#[cfg(feature = "user")]
impl serde::Serialize for HashVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.number())
    }
}

#[cfg(feature = "user")]
impl<'de> serde::Deserialize<'de> for HashVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = <i64 as serde::Deserialize>::deserialize(d)?;
        Self::parse_number(n).map_err(|e| <D::Error as serde::de::Error>::custom(std::format!("hash version {n}: {e}")))
    }
}

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
    /// An IPv6 flow: [`HashVersion::V2`] hashes all four address words
    /// (an IPv6 address may have words 1 to 3 zero too).
    pub ipv6: bool,
    /// BTH destination QP for RoCEv2 packets, 0 otherwise.
    pub dest_qp: u32,
}

/// Writes a flow key into `k`, one volatile store per field (the
/// pipeline's FLOW_KEY slot, and the bench's primitive of these stores):
/// built the plain way, LLVM merges an IPv4 key's zero words into a call
/// to memset, which on BPF is a byte loop; volatile stores are never
/// merged. `ports` are the source and destination port.
///
/// # Safety
/// `k` must be valid for writes; its padding is left as it was.
#[inline(always)]
pub unsafe fn store_flow_key(
    k: *mut FlowKey,
    src_word: impl Fn(usize) -> u32,
    dst_word: impl Fn(usize) -> u32,
    ipv6: bool,
    protocol: u8,
    ports: (u16, u16),
    dest_qp: u32,
) {
    use core::ptr::write_volatile;
    // SAFETY: the caller's.
    unsafe {
        for i in 0..4 {
            write_volatile(&raw mut (*k).src[i], src_word(i));
            write_volatile(&raw mut (*k).dst[i], dst_word(i));
        }
        write_volatile(&raw mut (*k).src_port, ports.0);
        write_volatile(&raw mut (*k).dst_port, ports.1);
        write_volatile(&raw mut (*k).protocol, protocol);
        write_volatile(&raw mut (*k).ipv6, ipv6);
        write_volatile(&raw mut (*k).dest_qp, dest_qp);
    }
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
        Self { src: ipv4_words(src), dst: ipv4_words(dst), src_port, dst_port, protocol, ipv6: false, dest_qp: 0 }
    }

    pub fn v6(src: [u8; 16], dst: [u8; 16], protocol: u8, src_port: u16, dst_port: u16) -> Self {
        Self::v6_ref(&src, &dst, protocol, src_port, dst_port)
    }

    /// Like [`FlowKey::v6`] without copying the addresses (the eBPF program
    /// reads them straight from the packet; its stack is small).
    #[inline(always)]
    pub fn v6_ref(src: &[u8; 16], dst: &[u8; 16], protocol: u8, src_port: u16, dst_port: u16) -> Self {
        Self { src: ipv6_words(src), dst: ipv6_words(dst), src_port, dst_port, protocol, ipv6: true, dest_qp: 0 }
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
    let mut h = mix_addresses(seed, key);
    h = mix(h, ports_word(key));
    h = mix(h, u32::from(key.protocol));
    mix(h, dest_qp)
}

/// MurmurHash3's steps over all eight address words, source first: the
/// start of version 1 for every key and of version 2 for IPv6.
#[inline(always)]
fn mix_addresses(seed: u32, key: &FlowKey) -> u32 {
    let mut h = mix(seed, key.src[0]);
    h = mix(h, key.src[1]);
    h = mix(h, key.src[2]);
    h = mix(h, key.src[3]);
    h = mix(h, key.dst[0]);
    h = mix(h, key.dst[1]);
    h = mix(h, key.dst[2]);
    mix(h, key.dst[3])
}

/// The two ports as one word, source port high (both hash versions and
/// the flowlet table's key).
#[inline(always)]
pub fn ports_word(key: &FlowKey) -> u32 {
    (u32::from(key.src_port) << 16) | u32::from(key.dst_port)
}

/// The protocol and a 24-bit DestQP as one word, protocol in the top byte
/// ([`HashVersion::V2`] and the flowlet table's key).
#[inline(always)]
pub fn protocol_qp_word(protocol: u8, dest_qp: u32) -> u32 {
    (u32::from(protocol) << 24) | (dest_qp & 0x00FF_FFFF)
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

/// The DestQP a group in `mode` hashes: only [`HashMode::Qp`] counts it
/// (and it is 0 for non-RoCE packets anyway).
#[inline(always)]
fn hashed_qp(key: &FlowKey, mode: HashMode) -> u32 {
    match mode {
        HashMode::Qp => key.dest_qp,
        HashMode::FiveTuple => 0,
    }
}

/// The hash a group in `mode` uses for this key under `version`: what
/// the dataplane, `explain`, the simulators and the tests all call.
#[inline(always)]
pub fn member_hash(key: &FlowKey, mode: HashMode, seed: u32, version: HashVersion) -> u32 {
    match (version, key.ipv6) {
        (HashVersion::V1, _) => hash_with_qp(key, hashed_qp(key, mode), seed),
        (HashVersion::V2, false) => v2_ipv4(key, hashed_qp(key, mode), seed),
        (HashVersion::V2, true) => v2_ipv6(key, hashed_qp(key, mode), seed),
    }
}

/// [`member_hash`] for a key whose family is known when compiling (the
/// XDP program's per-family paths; `V4`: an IPv4 key): the same value,
/// without a test of the key's family, and for version 1 of an IPv4 key
/// without the scramble of its zero words.
#[inline(always)]
pub fn member_hash_of_family<const V4: bool>(key: &FlowKey, mode: HashMode, seed: u32, version: HashVersion) -> u32 {
    let dest_qp = hashed_qp(key, mode);
    match (version, V4) {
        (HashVersion::V1, true) => v1_ipv4(key, dest_qp, seed),
        (HashVersion::V1, false) => hash_with_qp(key, dest_qp, seed),
        (HashVersion::V2, true) => v2_ipv4(key, dest_qp, seed),
        (HashVersion::V2, false) => v2_ipv6(key, dest_qp, seed),
    }
}

/// One step of [`mix`] for a zero word: a zero word scrambles to zero, so
/// only the rotate, multiply and add are left.
#[inline(always)]
fn mix_zero(h: u32) -> u32 {
    h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64)
}

/// Version 1 of an IPv4 key, the same value as the general version 1 with
/// fewer instructions: its address words 1 to 3 are zero ([`ipv4_words`]),
/// so their six steps skip the scramble. A key with any of those words set
/// would hash differently, so only IPv4 keys may come here.
#[inline(always)]
fn v1_ipv4(key: &FlowKey, dest_qp: u32, seed: u32) -> u32 {
    let mut h = mix(seed, key.src[0]);
    h = mix_zero(mix_zero(mix_zero(h)));
    h = mix(h, key.dst[0]);
    h = mix_zero(mix_zero(mix_zero(h)));
    h = mix(h, ports_word(key));
    h = mix(h, u32::from(key.protocol));
    h = mix(h, dest_qp);
    finalize(h, KEY_BYTES)
}

/// Version 2 of an IPv4 key: MurmurHash3 of 16 bytes (source, destination,
/// ports, protocol and DestQP), four dependent steps instead of eleven.
#[inline(always)]
fn v2_ipv4(key: &FlowKey, dest_qp: u32, seed: u32) -> u32 {
    let mut h = mix(seed, key.src[0]);
    h = mix(h, key.dst[0]);
    h = mix(h, ports_word(key));
    h = mix(h, protocol_qp_word(key.protocol, dest_qp));
    finalize(h, 16)
}

/// Version 2 of an IPv6 key: MurmurHash3 of 40 bytes (both addresses,
/// ports, protocol and DestQP).
#[inline(always)]
fn v2_ipv6(key: &FlowKey, dest_qp: u32, seed: u32) -> u32 {
    let mut h = mix_addresses(seed, key);
    h = mix(h, ports_word(key));
    h = mix(h, protocol_qp_word(key.protocol, dest_qp));
    finalize(h, 40)
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

    /// 20,000 random keys of one family (IPv6 keys get random words 1 to
    /// 3 too), with a random seed each.
    fn random_keys(v6: bool) -> impl Iterator<Item = (FlowKey, u32)> {
        let mut rng = 0x1234_5678_u64 ^ u64::from(v6);
        (0..20_000).map(move |_| {
            let r = crate::rng::splitmix64(&mut rng);
            let q = crate::rng::splitmix64(&mut rng);
            let key = if v6 {
                let mut src = [0u8; 16];
                src[..8].copy_from_slice(&r.to_le_bytes());
                src[8..].copy_from_slice(&crate::rng::splitmix64(&mut rng).to_le_bytes());
                let mut dst = [0u8; 16];
                dst[..8].copy_from_slice(&crate::rng::splitmix64(&mut rng).to_le_bytes());
                FlowKey::v6(src, dst, 17, q as u16, 4791)
            } else {
                FlowKey::v4((r as u32).to_be_bytes(), ((r >> 32) as u32).to_be_bytes(), 17, q as u16, 4791)
            };
            (key.with_dest_qp((q >> 16) as u32), (q >> 40) as u32)
        })
    }

    #[test]
    fn the_per_family_hash_equals_the_general_one_for_every_key() {
        for v6 in [false, true] {
            for (key, seed) in random_keys(v6) {
                for mode in HashMode::ALL {
                    for version in HashVersion::ALL {
                        let general = member_hash(&key, mode, seed, version);
                        let family = match v6 {
                            false => member_hash_of_family::<true>(&key, mode, seed, version),
                            true => member_hash_of_family::<false>(&key, mode, seed, version),
                        };
                        assert_eq!(family, general, "{key:?} {mode:?} {version:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn version_1_placement_is_pinned() {
        // Where version 1 put these flows when it was the only hash: a
        // fabric that keeps `hash_version = 1` (or no key) must keep them
        // there. The hashes are MurmurHash3_x86_32 of the 44-byte key from
        // an independent implementation; the members follow from them.
        let key = |qp| FlowKey::v4([10, 0, 0, 1], [10, 1, 0, 1], 17, 0xC000, 4791).with_dest_qp(qp);
        let expected = [
            (0x100, 1_396_607_822, 3, 3),
            (0x101, 2_555_900_826, 0, 0),
            (0x102, 3_021_704_060, 0, 4),
            (0x103, 3_784_812_973, 1, 1),
        ];
        for (qp, hash, of_4, of_8) in expected {
            assert_eq!(member_hash(&key(qp), HashMode::Qp, 1234, HashVersion::V1), hash, "QP {qp:#x}");
            let member = |n| crate::buckets::member_for(&crate::buckets::even_table(n), hash);
            assert_eq!((member(4), member(8)), (of_4, of_8), "QP {qp:#x}");
        }
        // The five-tuple mode is the qp mode's hash with DestQP 0.
        assert_eq!(
            member_hash(&key(0x100), HashMode::FiveTuple, 1234, HashVersion::V1),
            member_hash(&key(0), HashMode::Qp, 1234, HashVersion::V1)
        );
    }

    #[test]
    fn version_2_known_values_are_stable() {
        // MurmurHash3_x86_32 of the 16 (IPv4) and 40 (IPv6) key bytes from
        // an independent implementation.
        assert_eq!(member_hash(&roce_key(0x11), HashMode::Qp, 0, HashVersion::V2), 1_726_064_455);
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        a[15] = 1;
        let mut b = a;
        b[1] = 1;
        let key = FlowKey::v6(a, b, 17, 0xC123, 4791).with_dest_qp(0x11);
        assert_eq!(member_hash(&key, HashMode::Qp, 0, HashVersion::V2), 4_110_016_274);
        assert_eq!(member_hash(&key, HashMode::Qp, 0, HashVersion::V1), 3_205_340_880);
    }

    #[test]
    fn version_2_tells_the_families_apart() {
        // An IPv6 key whose words 1 to 3 are zero hashes all ten words, not
        // as the IPv4 key with the same first words.
        let v4 = FlowKey::v4([10, 0, 0, 1], [10, 1, 0, 1], 17, 1, 4791);
        let v6 = FlowKey { ipv6: true, ..v4 };
        assert_ne!(
            member_hash(&v4, HashMode::Qp, 0, HashVersion::V2),
            member_hash(&v6, HashMode::Qp, 0, HashVersion::V2)
        );
    }

    #[test]
    fn every_version_spreads_20000_random_keys_evenly() {
        // 20,000 keys over 16 members: 1250 expected each; 5 standard
        // deviations (about +-171) leave room for no seed in particular.
        for v6 in [false, true] {
            for version in HashVersion::ALL {
                let mut load = [0u32; 16];
                for (key, seed) in random_keys(v6) {
                    load[pick_member(member_hash(&key, HashMode::Qp, seed, version), 16) as usize] += 1;
                }
                let (min, max) = (load.iter().min().unwrap(), load.iter().max().unwrap());
                assert!(*min > 1080 && *max < 1420, "{version:?} v6 {v6}: min {min} max {max}");
            }
        }
    }

    #[test]
    fn every_input_bit_avalanches() {
        // Flipping any one bit of any word a version hashes flips each
        // output bit with probability 1/2: over 2000 keys, each output
        // bit's flip rate stays within 0.40..0.60 for every input bit.
        let flips: [fn(&mut FlowKey, u32); 6] = [
            |k, b| k.src[0] ^= 1 << b,
            |k, b| k.dst[0] ^= 1 << b,
            |k, b| k.src[3] ^= 1 << b,
            |k, b| k.src_port ^= 1 << (b % 16),
            |k, b| k.protocol ^= 1 << (b % 8),
            |k, b| k.dest_qp ^= 1 << (b % 24),
        ];
        for v6 in [false, true] {
            for version in HashVersion::ALL {
                for (word, flip) in flips.iter().enumerate() {
                    if word == 2 && !v6 {
                        continue; // IPv4 keys carry no word 3
                    }
                    for bit in [0, 7, 13, 23, 31] {
                        let mut flipped_per_output_bit = [0u32; 32];
                        let keys = random_keys(v6).take(2000);
                        for (key, seed) in keys {
                            let mut other = key;
                            flip(&mut other, bit);
                            let h = member_hash(&key, HashMode::Qp, seed, version);
                            let d = h ^ member_hash(&other, HashMode::Qp, seed, version);
                            for (out, n) in flipped_per_output_bit.iter_mut().enumerate() {
                                *n += (d >> out) & 1;
                            }
                        }
                        for (out, n) in flipped_per_output_bit.iter().enumerate() {
                            assert!(
                                (800..1200).contains(n),
                                "{version:?} v6 {v6} word {word} bit {bit} -> output bit {out}: {n}/2000"
                            );
                        }
                    }
                }
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
        for version in HashVersion::ALL {
            let mut load = [0u32; 64];
            let flows = 64 * 1000;
            for i in 0..flows {
                let key =
                    FlowKey::v4([10, 0, (i >> 8) as u8, i as u8], [10, 1, 0, 1], 17, 0xC000, 4791).with_dest_qp(i);
                load[pick_member(member_hash(&key, HashMode::Qp, 7, version), 64) as usize] += 1;
            }
            let (min, max) = (load.iter().min().unwrap(), load.iter().max().unwrap());
            // 1000 expected per member; 4 standard deviations is about +-126.
            assert!(*min > 850 && *max < 1150, "{version:?}: min {min} max {max}");
        }
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
        for v in HashVersion::ALL {
            assert_ne!(member_hash(&a, HashMode::Qp, 9, v), member_hash(&b, HashMode::Qp, 9, v));
            assert_eq!(member_hash(&a, HashMode::FiveTuple, 9, v), member_hash(&b, HashMode::FiveTuple, 9, v));
        }
    }

    #[test]
    fn qp_mode_spreads_one_source_port_over_uplinks() {
        // 64 QPs between two hosts, one UDP source port: the case Meta saw.
        for v in HashVersion::ALL {
            let mut used = [false; 4];
            for qp in 0..64 {
                used[pick_member(member_hash(&roce_key(0x100 + qp), HashMode::Qp, 1, v), 4) as usize] = true;
            }
            assert_eq!(used, [true; 4], "{v:?}");
        }
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
        assert_ne!(
            member_hash(&ka, HashMode::Qp, 0, HashVersion::V2),
            member_hash(&kb, HashMode::Qp, 0, HashVersion::V2)
        );
    }
}
