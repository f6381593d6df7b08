//! Text output shared by every command: aligned tables (comfy-table, no
//! borders, so the output reads like `ip` or `ss` and stays easy to grep)
//! and share bars on one scale.

use comfy_table::{presets::NOTHING, CellAlignment, ContentArrangement};

/// How a column's cells line up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// A table of named columns, rendered without borders: two spaces between
/// columns, numbers right-aligned, no trailing spaces.
pub struct Table {
    table: comfy_table::Table,
    indent: usize,
}

impl Table {
    /// A table with these (header, alignment) columns.
    pub fn new(columns: &[(&str, Align)]) -> Self {
        let mut table = comfy_table::Table::new();
        table.load_style(NOTHING).set_content_arrangement(ContentArrangement::Disabled);
        table.set_header(columns.iter().map(|(name, _)| *name));
        for (i, (_, align)) in columns.iter().enumerate() {
            let column = table.column_mut(i).expect("a column per header cell");
            column.set_padding((0, 2));
            column.set_cell_alignment(match align {
                Align::Left => CellAlignment::Left,
                Align::Right => CellAlignment::Right,
            });
        }
        Self { table, indent: 0 }
    }

    /// Indents every line by `spaces` (e.g. a group's members under it).
    pub fn indent(mut self, spaces: usize) -> Self {
        self.indent = spaces;
        self
    }

    pub fn row<I, C>(&mut self, cells: I) -> &mut Self
    where
        I: IntoIterator<Item = C>,
        C: Into<comfy_table::Cell>,
    {
        self.table.add_row(cells);
        self
    }

    /// The lines, each ending in a newline.
    pub fn render(&self) -> String {
        let pad = " ".repeat(self.indent);
        self.table.lines().map(|line| format!("{pad}{}\n", line.trim_end())).collect()
    }
}

/// The terminal's size (columns, rows) when standard output is one.
pub fn terminal_size() -> Option<(usize, usize)> {
    use std::io::IsTerminal as _;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    // SAFETY: TIOCGWINSZ writes a winsize into `size`.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) } == 0;
    (ok && size.ws_col > 0).then_some((size.ws_col as usize, size.ws_row as usize))
}

/// Characters of a bar for a whole (100 %) share.
pub const BAR_WIDTH: f64 = 30.0;

/// A bar of `#` as long as `share` (0.0 to 1.0) of [`BAR_WIDTH`].
pub fn share_bar(share: f64) -> String {
    "#".repeat((share.clamp(0.0, 1.0) * BAR_WIDTH).round() as usize)
}

/// Test helper: fails unless `xml` is well-formed (balanced tags, quoted
/// attributes, escaped `&`): enough to trust a picture opens.
#[cfg(test)]
pub fn assert_well_formed(xml: &str) {
    for (i, _) in xml.match_indices('&') {
        let entity = ["&amp;", "&lt;", "&gt;", "&quot;"].iter().any(|e| xml[i..].starts_with(e));
        assert!(entity, "bare '&' at byte {i}");
    }
    let mut stack: Vec<String> = Vec::new();
    let mut rest = xml.trim_start();
    rest = rest.strip_prefix("<?xml").and_then(|r| r.split_once("?>")).map_or(rest, |(_, r)| r);
    let mut roots = 0;
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        assert!(!text.contains('>'), "stray '>' in {text:?}");
        if stack.is_empty() {
            assert!(text.trim().is_empty(), "text outside the root: {text:?}");
        }
        let close = rest[open..].find('>').map(|c| open + c).expect("unclosed tag");
        let tag = &rest[open + 1..close];
        assert_eq!(tag.matches('"').count() % 2, 0, "unbalanced quotes in <{tag}>");
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name.trim()), "mismatched </{name}>");
        } else {
            let name = tag.split_whitespace().next().expect("empty tag").trim_end_matches('/').to_string();
            if stack.is_empty() {
                roots += 1;
            }
            if !tag.ends_with('/') {
                stack.push(name);
            }
        }
        rest = &rest[close + 1..];
    }
    assert!(stack.is_empty(), "unclosed: {stack:?}");
    assert!(rest.trim().is_empty());
    assert_eq!(roots, 1);
}

/// "200mbit", "1.5gbit": a rate as tc writes it.
pub fn rate_text(bps: u64) -> String {
    let (v, unit) = match bps {
        b if b >= 1_000_000_000 => (b as f64 / 1e9, "gbit"),
        b if b >= 1_000_000 => (b as f64 / 1e6, "mbit"),
        b if b >= 1_000 => (b as f64 / 1e3, "kbit"),
        b => (b as f64, "bit"),
    };
    format!("{}{unit}", trim_number(v))
}

/// "64k", "1m", "1500": a size as tc writes it.
pub fn size_text(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}m", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}k", b >> 10),
        b => b.to_string(),
    }
}

/// "2ms", "500us": a flowlet gap in microseconds as configs and tables write it.
pub fn gap_text(us: u32) -> String {
    if us >= 1000 && us.is_multiple_of(1000) {
        format!("{}ms", us / 1000)
    } else {
        format!("{us}us")
    }
}

fn trim_number(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_without_borders_or_trailing_spaces() {
        let mut t = Table::new(&[("NAME", Align::Left), ("PACKETS", Align::Right), ("", Align::Left)]);
        t.row(["u1", "7", ""]).row(["uplink-two", "12345", "##"]);
        let t = t.indent(2);
        assert_eq!(t.render(), "  NAME        PACKETS\n  u1                7\n  uplink-two    12345  ##\n");
    }

    #[test]
    fn bars_share_one_scale() {
        assert_eq!(share_bar(1.0).len(), 30);
        assert_eq!(share_bar(0.5).len(), 15);
        assert_eq!(share_bar(0.0), "");
        assert_eq!(share_bar(2.0).len(), 30);
    }
}
