//! SplitMix64: a tiny, well-mixed deterministic generator, for seeded
//! choices in the tools and the benchmark (source ports, random routes).

/// Advances `state` and returns the next value.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reference_values() {
        // The first outputs of the reference SplitMix64 seeded with 0.
        let mut s = 0u64;
        assert_eq!(super::splitmix64(&mut s), 0xE220_A839_7B1D_CDAF);
        assert_eq!(super::splitmix64(&mut s), 0x6E78_9E6A_A1B9_65F4);
    }
}
