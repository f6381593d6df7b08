//! Turning toml and serde errors into messages that name the file, line,
//! column and key, with a fix.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::validate::Source;
use super::*;
use crate::sys::suggest::closest_match;

/// 1-based line and column (in characters) of byte `offset` in `text`.
pub(super) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    // Spans are byte offsets; never slice in the middle of a character.
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

impl Source<'_> {
    /// A toml error (syntax, or serde's unknown key / missing key / wrong
    /// type) as our one-line message with the key path.
    pub(super) fn toml_error(&self, e: &toml::de::Error) -> ConfigError {
        let raw_message = e.message();
        let Some(span) = e.span() else {
            return ConfigError::File {
                path: self.path.to_path_buf(),
                key: String::new(),
                message: one_line(raw_message),
            };
        };
        // toml's errors carry a span but no key path. If the document is
        // valid TOML (the error came from our structs), find the key by
        // walking a spanned tree of it; otherwise (a syntax error, or one
        // of the few documents toml cannot give spans for, such as
        // `[a.b]` headers) guess the key from the text of the line.
        let key = match toml::from_str::<Spanned<Node>>(self.text) {
            Ok(tree) => key_at(&tree, &span, raw_message),
            Err(_) => guess_key(self.text, span.start).unwrap_or_default(),
        };
        let message = explain(raw_message, &key);
        self.err(key, span, message)
    }
}

/// A TOML document reduced to its shape and spans, for finding the key
/// path of a byte span.
pub(super) enum Node {
    Table(Vec<(String, Spanned<Node>)>),
    Array(Vec<Spanned<Node>>),
    Leaf,
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> serde::de::Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any TOML value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_str<E>(self, _: &str) -> Result<Node, E> {
                Ok(Node::Leaf)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Array(items))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    entries.push((key, map.next_value()?));
                }
                Ok(Node::Table(entries))
            }
        }
        d.deserialize_any(NodeVisitor)
    }
}

/// The key path of the innermost value containing `span`.
///
/// For an unknown key, `span` is the key itself and the path is that of
/// the innermost table on the way that holds the key. (Only looking for
/// the innermost value is not enough: the span of a `[[ports]]` key lies
/// inside the span of its own table.)
pub(super) fn key_at(root: &Spanned<Node>, span: &Range<usize>, message: &str) -> String {
    let contains = |outer: Range<usize>| outer.start < outer.end && outer.start <= span.start && span.end <= outer.end;
    let unknown = unknown_key(message);
    let mut path = String::new();
    let mut holder_of_unknown = None;
    // The root's span is empty; it contains everything.
    let mut node = root.get_ref();
    loop {
        match node {
            Node::Table(entries) => {
                if unknown.is_some_and(|u| entries.iter().any(|(k, _)| k == u)) {
                    holder_of_unknown = Some(path.clone());
                }
                match entries.iter().find(|(_, v)| contains(v.span())) {
                    Some((k, v)) => {
                        if !path.is_empty() {
                            path.push('.');
                        }
                        path.push_str(k);
                        node = v.get_ref();
                    }
                    None => break,
                }
            }
            Node::Array(items) => match items.iter().position(|v| contains(v.span())) {
                Some(i) => {
                    path.push_str(&format!("[{i}]"));
                    node = items[i].get_ref();
                }
                None => break,
            },
            Node::Leaf => break,
        }
    }
    match unknown {
        Some(u) => {
            // A key in a sub-table header (`[dataplane.x]`) lies outside
            // every value span; fall back to any table holding the key.
            let table = holder_of_unknown.or_else(|| table_holding(root.get_ref(), u, String::new())).unwrap_or(path);
            if table.is_empty() {
                u.to_string()
            } else {
                format!("{table}.{u}")
            }
        }
        None => path,
    }
}

/// Path of the first table (depth first) that has an entry named `key`.
pub(super) fn table_holding(node: &Node, key: &str, path: String) -> Option<String> {
    match node {
        Node::Table(entries) => {
            if entries.iter().any(|(k, _)| k == key) {
                return Some(path);
            }
            entries.iter().find_map(|(k, v)| {
                let sub = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                table_holding(v.get_ref(), key, sub)
            })
        }
        Node::Array(items) => {
            items.iter().enumerate().find_map(|(i, v)| table_holding(v.get_ref(), key, format!("{path}[{i}]")))
        }
        Node::Leaf => None,
    }
}

/// Best effort for syntax errors: `section[n].key` from the `key = ...`
/// at the start of the error's line and the `[section]` / `[[section]]`
/// header above it. Only when the error is in a plain value: inside an
/// inline table or array the key of the line would be misleading.
pub(super) fn guess_key(text: &str, offset: usize) -> Option<String> {
    let (line, column) = line_col(text, offset);
    let line_text = text.lines().nth(line - 1)?;
    // An error in a table header (e.g. `[dataplane.extra]`) is about that table.
    if let Some(header) = line_text.trim().strip_prefix('[') {
        let name = header.trim_start_matches('[').split(']').next()?.trim();
        return (!name.is_empty()).then(|| name.to_string());
    }
    let (key, value) = line_text.split_once('=')?;
    let before_error: String = value.chars().take(column.saturating_sub(key.chars().count() + 2)).collect();
    if before_error.contains(['{', '[']) {
        return None;
    }
    let mut section = String::new();
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for l in text.lines().take(line - 1) {
        let l = l.trim();
        if let Some(name) = l.strip_prefix("[[").and_then(|r| r.split_once("]]")).map(|(n, _)| n.trim()) {
            let n = counts.entry(name).or_insert(0);
            section = format!("{name}[{n}]");
            *n += 1;
        } else if let Some(name) = l.strip_prefix('[').and_then(|r| r.split_once(']')).map(|(n, _)| n.trim()) {
            section = name.to_string();
        }
    }
    let key = key.trim();
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return None;
    }
    Some(if section.is_empty() { key.to_string() } else { format!("{section}.{key}") })
}

/// The name in serde's "unknown field `NAME`, expected ...".
pub(super) fn unknown_key(message: &str) -> Option<&str> {
    message.strip_prefix("unknown field `")?.split_once('`').map(|(k, _)| k)
}

/// Rewords serde's messages for people editing TOML (keys, tables and
/// arrays rather than fields, maps and sequences) and adds a hint.
pub(super) fn explain(message: &str, key: &str) -> String {
    if let Some(unknown) = unknown_key(message) {
        let valid: Vec<&str> = message.split('`').skip(3).step_by(2).collect();
        let mut out = format!("unknown key `{unknown}`");
        if let Some(close) = closest_match(unknown, valid.iter().copied()) {
            out.push_str(&format!(" (did you mean `{close}`?)"));
        }
        if valid.is_empty() {
            out.push_str("; no keys are allowed here");
        } else {
            let list: Vec<String> = valid.iter().map(|v| format!("`{v}`")).collect();
            out.push_str(&format!("; valid keys here: {}", list.join(", ")));
        }
        return out;
    }
    if let Some(rest) = message.strip_prefix("missing field `") {
        let missing = rest.split_once('`').map_or(rest, |(k, _)| k);
        return format!("missing required key `{missing}`");
    }
    let mut out = one_line(message)
        .replace("invalid type: map", "invalid type: table")
        .replace("invalid type: sequence", "invalid type: array")
        .replace("expected a sequence", "expected an array")
        .replace("expected a map", "expected a table")
        .replace("expected i64", "expected an integer");
    // Hints fit wrong types and malformed values, not e.g. duplicate keys
    // or an unterminated string.
    let about_value = out.starts_with("invalid") || out.starts_with("number");
    let wrong_type = out.starts_with("invalid type");
    if let Some(hint) = value_hint(key, wrong_type).filter(|_| about_value) {
        out.push_str("; ");
        out.push_str(&hint);
    }
    out
}

/// What a key's value should look like, appended to type and syntax
/// errors. Keys whose value is any string only get a hint for a wrong type.
pub(super) fn value_hint(key: &str, wrong_type: bool) -> Option<String> {
    // Top-level sections are most often written `[port]` instead of `[[port]]`.
    if matches!(key, "port" | "group" | "route") {
        return Some(format!("write each {key} as its own [[{key}]] section (double brackets)"));
    }
    let leaf = key.rsplit('.').next().unwrap_or(key);
    let leaf = leaf.split('[').next().unwrap_or(leaf);
    let hint = match leaf {
        "hash" => "use \"qp\" or \"five-tuple\"",
        "xdp_mode" => "use \"native\" or \"skb\"",
        "hash_seed" => "use a whole number from 0 to 4294967295",
        "hash_version" => "use 1 or 2",
        "neighbour_refresh_ms" => "use a whole number of milliseconds from 100 to 60000",
        "telemetry_qps" => "use a whole number of QPs from 0 (off) to 1048576",
        "members" => "write an array of tables, e.g. members = [{ dev = \"eth2\", via = \"10.0.2.2\" }]",
        "name" | "dev" | "via" | "mac" | "prefix" | "group" | "pin_dir" if wrong_type => {
            "write the value in double quotes"
        }
        _ => return None,
    };
    Some(hint.to_string())
}

pub(super) fn one_line(message: &str) -> String {
    message.trim().lines().map(str::trim).collect::<Vec<_>>().join("; ")
}
