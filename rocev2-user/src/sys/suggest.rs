//! "Did you mean": the closest of some candidates to a word typed wrong
//! (config keys, namespace names). The lowest layer, so every layer can use it.

/// The candidate `word` most likely meant, for "did you mean": the nearest
/// within two edits (`polcy` -> `policy`, `flowlet_gap_ms` ->
/// `flowlet_gap_us`), else the only one that is `word` with its unit or
/// qualifier left off (`flowlet_gap` -> `flowlet_gap_us`).
pub fn closest_match<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let candidates: Vec<&str> = candidates.into_iter().collect();
    let nearest = candidates
        .iter()
        .map(|c| (edit_distance(word, c), *c))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c);
    nearest.or_else(|| {
        // A missing suffix: the word plus `_something`, or the word is
        // the candidate's first part (at least 4 characters, so `a` does
        // not match everything).
        let mut prefixed = candidates
            .iter()
            .filter(|c| word.len() >= 4 && c.len() > word.len() && c.starts_with(word))
            .filter(|c| matches!(c.as_bytes()[word.len()], b'_' | b'-'));
        match (prefixed.next(), prefixed.next()) {
            (Some(only), None) => Some(*only),
            _ => None,
        }
    })
}

/// Levenshtein distance, for "did you mean" on misspelled keys.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn did_you_mean_counts_a_missing_unit_suffix() {
        let keys = ["name", "policy", "flowlet_gap_us", "flowlet_choice", "flowlet_boundary", "hash_seed"];
        assert_eq!(closest_match("flowlet_gap", keys), Some("flowlet_gap_us"));
        assert_eq!(closest_match("polcy", keys), Some("policy"));
        assert_eq!(closest_match("hash_sed", keys), Some("hash_seed"));
        assert_eq!(closest_match("flowlet_gap_ms", keys), Some("flowlet_gap_us"));
        // Ambiguous (three keys begin with `flowlet_`) or unrelated: no guess.
        assert_eq!(closest_match("flowlet", keys), None);
        assert_eq!(closest_match("color", keys), None);
    }

    #[test]
    fn edit_distance_basics() {
        assert_eq!(edit_distance("via", "via"), 0);
        assert_eq!(edit_distance("vias", "via"), 1);
        assert_eq!(edit_distance("hashseed", "hash_seed"), 1);
        assert_eq!(edit_distance("ports", "route"), 3);
    }
}
