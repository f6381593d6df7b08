//! The link check of `cargo xtask docs`: every link inside the built book
//! (a page that exists, and an element with the `#anchor` it names), and
//! every relative link of a Markdown file outside the book (README.md: a
//! file that exists and, for a Markdown file, a heading with the anchor),
//! every `{{#include file:anchor}}` of the book's sources, and that
//! SUMMARY.md lists every chapter file.
//! Links to other sites are not followed (there is no network in CI).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Component, Path, PathBuf},
};

use anyhow::{Context as _, Result};

/// Broken links of the HTML book under `root`, as "page: href: why".
pub fn check_book(root: &Path) -> Result<Vec<String>> {
    let mut pages = BTreeMap::new();
    collect_html(root, &mut pages)?;
    let ids: BTreeMap<&PathBuf, BTreeSet<String>> =
        pages.iter().map(|(path, text)| (path, attribute_values(text, "id").into_iter().collect())).collect();
    let mut broken = Vec::new();
    for (page, text) in &pages {
        for href in attribute_values(text, "href") {
            if is_external(&href) {
                continue;
            }
            let (target, anchor) = href.split_once('#').unwrap_or((&href, ""));
            let target_path = if target.is_empty() {
                page.clone()
            } else {
                // An absolute link (the 404 page's) starts at the book's root.
                let base =
                    if target.starts_with('/') { root } else { page.parent().expect("a page is in a directory") };
                let joined = normalize(&base.join(target.trim_start_matches('/')));
                if target.ends_with('/') {
                    joined.join("index.html")
                } else {
                    joined
                }
            };
            let shown = page.strip_prefix(root).unwrap_or(page).display();
            if !target_path.starts_with(root) {
                broken.push(format!("{shown}: {href}: points outside the book"));
            } else if !target_path.exists() {
                broken.push(format!("{shown}: {href}: no such page"));
            } else if !anchor.is_empty() {
                match ids.get(&target_path) {
                    Some(ids) if ids.contains(anchor) => {}
                    Some(_) => broken.push(format!("{shown}: {href}: no anchor #{anchor} on that page")),
                    None => broken.push(format!("{shown}: {href}: an anchor into a file that is not a page")),
                }
            }
        }
    }
    Ok(broken)
}

/// Broken relative links of the Markdown file `file` (relative to `root`).
pub fn check_markdown(root: &Path, file: &Path) -> Result<Vec<String>> {
    let path = root.join(file);
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut broken = Vec::new();
    for link in markdown_links(&text) {
        if is_external(&link) {
            continue;
        }
        let (target, anchor) = link.split_once('#').unwrap_or((&link, ""));
        let target_path =
            if target.is_empty() { path.clone() } else { normalize(&path.parent().unwrap().join(target)) };
        if !target_path.exists() {
            broken.push(format!("{}: {link}: no such file", file.display()));
        } else if !anchor.is_empty() {
            let target_text = std::fs::read_to_string(&target_path).unwrap_or_default();
            if !headings(&target_text).iter().any(|h| github_anchor(h) == anchor) {
                broken.push(format!("{}: {link}: no heading with that anchor", file.display()));
            }
        }
    }
    Ok(broken)
}

/// Chapters under `src` that SUMMARY.md does not list: mdbook leaves
/// them out of the book without a word.
pub fn check_summary(src: &Path) -> Result<Vec<String>> {
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).context("the book has no SUMMARY.md")?;
    let listed: BTreeSet<String> = markdown_links(&summary).into_iter().collect();
    let mut orphans = Vec::new();
    for entry in std::fs::read_dir(src)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") && name != "SUMMARY.md" && !listed.contains(&name) {
            orphans.push(format!("docs/src/{name}: not in SUMMARY.md, so not in the book"));
        }
    }
    Ok(orphans)
}

/// Broken `{{#include FILE:ANCHOR}}`s of the book's sources in `src`:
/// mdbook includes nothing, silently, for an anchor the file lacks.
pub fn check_includes(src: &Path) -> Result<Vec<String>> {
    let mut broken = Vec::new();
    for entry in std::fs::read_dir(src).with_context(|| format!("cannot read {}", src.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        for include in text.split("{{#include ").skip(1).filter_map(|rest| rest.split_once("}}").map(|(i, _)| i)) {
            let (file, anchor) = include.split_once(':').unwrap_or((include, ""));
            let shown =
                format!("{}: {{{{#include {include}}}}}", path.file_name().unwrap_or_default().to_string_lossy());
            let Ok(target) = std::fs::read_to_string(path.parent().unwrap().join(file.trim())) else {
                broken.push(format!("{shown}: no such file"));
                continue;
            };
            let named = !anchor.is_empty() && !anchor.starts_with(|c: char| c.is_ascii_digit() || c == ':');
            if named
                && !(target.contains(&format!("ANCHOR: {anchor}")) && target.contains(&format!("ANCHOR_END: {anchor}")))
            {
                broken.push(format!("{shown}: the file has no ANCHOR/ANCHOR_END pair named {anchor}"));
            }
        }
    }
    Ok(broken)
}

fn collect_html(dir: &Path, pages: &mut BTreeMap<PathBuf, String>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect_html(&path, pages)?;
        } else if path.extension().is_some_and(|e| e == "html") {
            pages.insert(path.clone(), std::fs::read_to_string(&path)?);
        }
    }
    Ok(())
}

fn is_external(link: &str) -> bool {
    link.contains("://") || link.starts_with("mailto:") || link.starts_with("javascript:") || link.starts_with("//")
}

/// The values of every `name="..."` attribute in `html` (entities that
/// matter in a URL or an id decoded).
fn attribute_values(html: &str, name: &str) -> Vec<String> {
    let needle = format!(" {name}=\"");
    html.match_indices(&needle)
        .filter_map(|(at, _)| {
            let rest = &html[at + needle.len()..];
            let value = &rest[..rest.find('"')?];
            Some(value.replace("&amp;", "&").replace("%20", " "))
        })
        .collect()
}

/// `path` with `.` and `..` resolved, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The targets of the inline links `[text](target)` outside code blocks.
fn markdown_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            links.push(after[..end].trim().to_string());
            rest = &after[end..];
        }
    }
    links
}

/// The text of every heading line (`# ...`) outside code blocks.
fn headings(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            out.push(line.trim_start_matches('#').trim().to_string());
        }
    }
    out
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped but
/// `-` and `_`, spaces as `-`.
fn github_anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_and_links() {
        assert_eq!(github_anchor("Tutorial: a RoCE fabric in one box"), "tutorial-a-roce-fabric-in-one-box");
        assert_eq!(markdown_links("see [a](b.md#c) and [d](https://e)\n```\n[x](y)\n```\n"), ["b.md#c", "https://e"]);
        let html = r#"<a href="x.html#top">x</a><h2 id="top">"#;
        assert_eq!(attribute_values(html, "href"), ["x.html#top"]);
        assert_eq!(attribute_values(html, "id"), ["top"]);
        assert_eq!(normalize(Path::new("/a/b/../c/./d")), Path::new("/a/c/d"));
    }
}
