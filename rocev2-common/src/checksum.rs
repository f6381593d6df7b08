//! Internet checksum helpers (RFC 1071 / RFC 1624).

/// Incrementally updates a ones'-complement checksum when one 16-bit word of
/// the covered data changes from `old` to `new` (RFC 1624, eqn. 3:
/// HC' = ~(~HC + ~m + m')). All values are the big-endian words read as
/// numbers, so the caller converts with `u16::from_be_bytes`.
#[inline(always)]
pub fn update_u16(check: u16, old: u16, new: u16) -> u16 {
    let mut sum = u32::from(!check) + u32::from(!old) + u32::from(new);
    sum = (sum & 0xFFFF) + (sum >> 16);
    sum = (sum & 0xFFFF) + (sum >> 16);
    !(sum as u16)
}

/// Folds the carries of a 32-bit sum of 16-bit words into 16 bits: the
/// ones'-complement sum (RFC 1071). Two folds are enough for any u32 (the
/// u32 itself holds the sum of up to 65,537 words). A header with a right
/// checksum sums to 0xFFFF, whichever byte order the words were read in.
#[inline(always)]
pub fn fold(sum: u32) -> u16 {
    let sum = (sum & 0xFFFF) + (sum >> 16);
    ((sum & 0xFFFF) + (sum >> 16)) as u16
}

/// The sum of `data`'s big-endian 16-bit words, not yet folded; an odd
/// final byte is padded with zero as RFC 1071 says. Partial sums of
/// adjacent even-length pieces add up (pseudo-headers, cached prefixes).
pub fn word_sum(data: &[u8]) -> u32 {
    let mut sum: u32 = 0;
    let mut chunks = data.chunks_exact(2);
    for pair in &mut chunks {
        sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(u16::from_be_bytes([*last, 0]));
    }
    sum
}

/// Full checksum over `data` (even length expected; an odd final byte is
/// padded with zero). Used by userspace and tests to verify what the
/// dataplane patched incrementally.
pub fn internet_checksum(data: &[u8]) -> u16 {
    !fold(word_sum(data))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(ttl: u8) -> [u8; 20] {
        let mut h = [0x45, 0x00, 0x00, 0x54, 0x12, 0x34, 0x40, 0x00, ttl, 0x11, 0, 0, 10, 0, 1, 2, 10, 1, 0, 9];
        let c = internet_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h
    }

    #[test]
    fn ttl_decrement_matches_full_recompute() {
        for ttl in 2..=255u8 {
            let h = header(ttl);
            let old = u16::from_be_bytes([h[8], h[9]]);
            let new = u16::from_be_bytes([ttl - 1, h[9]]);
            let check = update_u16(u16::from_be_bytes([h[10], h[11]]), old, new);
            assert_eq!(check, u16::from_be_bytes(header(ttl - 1)[10..12].try_into().unwrap()));
        }
    }

    #[test]
    fn valid_header_sums_to_zero() {
        assert_eq!(internet_checksum(&header(64)), 0);
    }

    /// The dataplane's check: native-endian words, folded, 0xFFFF when right.
    fn folds_to_all_ones(h: &[u8]) -> bool {
        let sum: u32 = h.chunks_exact(2).map(|w| u32::from(u16::from_ne_bytes([w[0], w[1]]))).sum();
        fold(sum) == 0xFFFF
    }

    #[test]
    fn fold_accepts_right_headers_and_rejects_every_single_bit_error() {
        for ttl in 0..=255u8 {
            assert!(folds_to_all_ones(&header(ttl)));
        }
        let good = header(64);
        for bit in 0..good.len() * 8 {
            let mut h = good;
            h[bit / 8] ^= 1 << (bit % 8);
            assert!(!folds_to_all_ones(&h), "bit {bit} flipped still passes");
        }
        // The largest sum it is given: a 60-byte header of 0xFFFF words.
        assert_eq!(fold(30 * 0xFFFF), 0xFFFF);
    }
}
