//! Replaying the book (`docs/src`): its chapters and sections, and the
//! comparison of what a command printed with the output block the book
//! shows, where an expected line `…` stands for any number of lines.

use std::{io::Write as _, path::Path};

/// The book's chapter `file` (a name under `docs/src`, as SUMMARY.md
/// links it).
pub fn chapter(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The front page, README.md (the book includes its intro, quick start
/// and minimal config).
pub fn front_page() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap()
}

/// The chapter `file` from `heading` (a line starting with it) to the next
/// line starting with `until`, or to its end.
pub fn section(file: &str, heading: &str, until: &str) -> String {
    let text = chapter(file);
    let start = text.find(heading).unwrap_or_else(|| panic!("{file} has no {heading:?}"));
    let end = text[start + heading.len()..].find(until).map_or(text.len(), |e| start + heading.len() + e);
    text[start..end].to_string()
}

/// Numbers masked (each run of digits is one `0`), bars and repeated
/// spaces dropped: what stays the same from run to run.
pub fn mask(line: &str) -> String {
    let mut out = String::new();
    let mut in_digits = false;
    for c in line.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('0');
            }
            in_digits = true;
            continue;
        }
        in_digits = false;
        if c != '#' {
            out.push(c);
        }
    }
    squeeze(&out)
}

/// Repeated spaces folded, ends trimmed: table alignment aside, the line
/// as printed.
pub fn squeeze(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `expected` appears in `actual` as consecutive lines, both
/// passed through `normalize`, where an expected line `…` stands for any
/// number of lines.
pub fn appears(expected: &[String], actual: &[String], normalize: fn(&str) -> String) -> bool {
    fn from(e: &[String], a: &[String]) -> bool {
        match e.split_first() {
            None => true,
            Some((first, rest)) if first == "…" => (0..=a.len()).any(|k| from(rest, &a[k..])),
            Some((first, rest)) => a.first().is_some_and(|l| l == first) && from(rest, &a[1..]),
        }
    }
    let e: Vec<String> = expected.iter().map(|l| if l == "…" { l.clone() } else { normalize(l) }).collect();
    let a: Vec<String> = actual.iter().map(|l| normalize(l)).collect();
    (0..=a.len()).any(|start| from(&e, &a[start..]))
}

/// Fails unless `expected` appears in `actual` (see [`appears`]). To
/// refresh the book after an output change, run the test with
/// ROCEV2_TUTORIAL_OUTPUT=FILE and copy what each step printed.
pub fn assert_shows(what: &str, expected: &[String], actual: &str, normalize: fn(&str) -> String) {
    if let Ok(path) = std::env::var("ROCEV2_TUTORIAL_OUTPUT") {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        writeln!(file, "==== {what}\n{actual}").unwrap();
    }
    let actual: Vec<String> = actual.lines().map(str::to_string).collect();
    assert!(
        appears(expected, &actual, normalize),
        "{what}: the book shows\n{}\nbut the command printed\n{}",
        expected.join("\n"),
        actual.join("\n")
    );
}

/// Every word with a digit in it masked (counters, rates, addresses, QPNs
/// and PSNs in hex, PIDs, link names like s1p1), spacing folded: what a
/// real RDMA stack prints the same from run to run.
pub fn mask_words(line: &str) -> String {
    line.split_whitespace()
        .map(|w| if w.bytes().any(|b| b.is_ascii_digit()) { "N" } else { w })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One `$ command` of a chapter's `console` blocks and the lines under it.
pub struct Step {
    pub command: String,
    pub expected: Vec<String>,
}

/// The `$ ` commands of `file`'s `console` blocks, in order, each with the
/// lines the book shows under it.
pub fn console_steps(file: &str) -> Vec<Step> {
    let text = chapter(file);
    let mut steps: Vec<Step> = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```console" {
            continue;
        }
        for l in lines.by_ref().take_while(|l| l.trim() != "```") {
            match l.strip_prefix("$ ") {
                Some(command) => steps.push(Step { command: command.to_string(), expected: Vec::new() }),
                None => steps
                    .last_mut()
                    .unwrap_or_else(|| panic!("a console block of {file} starts with a command"))
                    .expected
                    .push(l.to_string()),
            }
        }
    }
    steps
}
