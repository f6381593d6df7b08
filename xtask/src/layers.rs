//! The layer check: reads the sources (nothing is built or run) and fails
//! when an import points up a layer, or when a crate's files import each
//! other in a circle.
//!
//! rocev2-user's library is layered, top to bottom:
//! `testbed` → `tools` → `control` → `render` → `sys`. A file may use its
//! own layer and the ones below it, never one above (the CLI, `main.rs`,
//! sits on top of them all). Every crate (rocev2-common, both eBPF objects,
//! rocev2-user) must also be free of import cycles between its files. A
//! module may use what its ancestors declare (the parent is the namespace
//! its children live in), so a child's `use super::...` is not an edge.
//!
//! Imports are read with `syn` from every `use`, every path in code and
//! types, and the tokens of macro calls (`format!`, `bail!`), so
//! `crate::tools::gen::device_mac(..)` written inline counts like a `use`.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// rocev2-user's layers, top to bottom.
pub const USER_LAYERS: &[&str] = &["testbed", "tools", "control", "render", "sys"];

/// The crates whose files must not import each other in a circle: a
/// crate root (relative to the workspace) and a name for messages.
const CRATE_ROOTS: &[(&str, &str)] = &[
    ("rocev2-common/src/lib.rs", "rocev2-common"),
    ("rocev2-ebpf/src/main.rs", "rocev2-ebpf (the rocev2 object)"),
    ("rocev2-ebpf/src/tools/main.rs", "rocev2-ebpf (the rocev2-tools object)"),
    ("rocev2-user/src/lib.rs", "rocev2-user"),
];

/// Every problem found in the workspace at `root`, as messages naming the
/// file and line; empty when the layering holds.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for (crate_root, name) in CRATE_ROOTS {
        let tree = Tree::load(root, Path::new(crate_root))?;
        let edges = tree.edges();
        if *crate_root == "rocev2-user/src/lib.rs" {
            problems.extend(upward_imports(&tree, &edges));
        }
        problems.extend(cycles(&tree, &edges, name));
    }
    Ok(problems)
}

/// `cargo xtask lint`'s stage: fails with every problem listed.
pub fn lint(root: &Path) -> Result<()> {
    let problems = check(root)?;
    if problems.is_empty() {
        return Ok(());
    }
    for p in &problems {
        eprintln!("{p}");
    }
    bail!("{} layering problem(s) (above)", problems.len())
}

/// A crate's modules, as its `mod` declarations lay them out.
struct Tree {
    /// The workspace root, for relative file names in messages.
    root: PathBuf,
    /// Module path (from the crate root) -> the file it lives in (an inline
    /// module lives in its parent's file).
    modules: BTreeMap<Vec<String>, PathBuf>,
    /// Every file and the module it is.
    files: Vec<(PathBuf, Vec<String>)>,
    /// Every file as parsed, in the order of `files`.
    parsed: Vec<syn::File>,
}

/// One file using another: where, and the path as written.
struct Edge {
    from: PathBuf,
    to: PathBuf,
    line: usize,
    path: String,
}

impl Tree {
    fn load(root: &Path, crate_root: &Path) -> Result<Tree> {
        let mut tree =
            Tree { root: root.to_path_buf(), modules: BTreeMap::new(), files: Vec::new(), parsed: Vec::new() };
        tree.load_file(&root.join(crate_root), Vec::new(), true)?;
        Ok(tree)
    }

    /// Loads `file` as module `path`; `mod_rs` when its children live in
    /// its own directory (a crate root or a mod.rs).
    fn load_file(&mut self, file: &Path, path: Vec<String>, mod_rs: bool) -> Result<()> {
        let parsed = parse(file)?;
        self.modules.insert(path.clone(), file.to_path_buf());
        let dir = file.parent().context("a source file has a directory")?;
        let children_dir =
            if mod_rs { dir.to_path_buf() } else { dir.join(file.file_stem().context("a source file has a name")?) };
        self.load_items(&parsed.items, file, &path, dir, &children_dir)?;
        self.files.push((file.to_path_buf(), path));
        self.parsed.push(parsed);
        Ok(())
    }

    fn load_items(
        &mut self,
        items: &[syn::Item],
        file: &Path,
        path: &[String],
        file_dir: &Path,
        children_dir: &Path,
    ) -> Result<()> {
        for item in items {
            let syn::Item::Mod(m) = item else { continue };
            let name = m.ident.to_string();
            let mut child = path.to_vec();
            child.push(name.clone());
            if let Some((_, inline)) = &m.content {
                self.modules.insert(child.clone(), file.to_path_buf());
                self.load_items(inline, file, &child, file_dir, &children_dir.join(&name))?;
                continue;
            }
            let (child_file, mod_rs) = match path_attribute(&m.attrs) {
                Some(explicit) => (file_dir.join(explicit), false),
                None => {
                    let flat = children_dir.join(format!("{name}.rs"));
                    if flat.exists() {
                        (flat, false)
                    } else {
                        (children_dir.join(&name).join("mod.rs"), true)
                    }
                }
            };
            if !child_file.exists() {
                bail!("{}: `mod {name};` has no file {}", file.display(), child_file.display());
            }
            self.load_file(&child_file, child, mod_rs)?;
        }
        Ok(())
    }

    /// Every use of one of the crate's files by another.
    fn edges(&self) -> Vec<Edge> {
        let mut edges = Vec::new();
        for ((file, module), parsed) in self.files.iter().zip(&self.parsed) {
            let mut refs = Refs { module: module.clone(), found: Vec::new() };
            // Only the file's own items: inline modules are walked with
            // their path, child files on their own turn.
            refs.visit_file(parsed);
            for (current, segments, line) in refs.found {
                let Some(target) = self.resolve(&current, &segments) else { continue };
                // Itself, or an ancestor: the namespace it lives in.
                if current.starts_with(&target) {
                    continue;
                }
                let to = &self.modules[&target];
                if to != file {
                    edges.push(Edge { from: file.clone(), to: to.clone(), line, path: segments.join("::") });
                }
            }
        }
        edges
    }

    /// The deepest module of the crate that `segments`, written in module
    /// `current`, names.
    fn resolve(&self, current: &[String], segments: &[String]) -> Option<Vec<String>> {
        let (first, rest) = segments.split_first()?;
        let base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => current.to_vec(),
            "super" => {
                let mut up = current.to_vec();
                up.pop()?;
                let mut rest = rest;
                while let Some(("super", tail)) = rest.split_first().map(|(h, t)| (h.as_str(), t)) {
                    up.pop()?;
                    rest = tail;
                }
                return self.deepest(up, rest);
            }
            // A child module named without a prefix (`fabric::up(..)`).
            name => {
                let mut child = current.to_vec();
                child.push(name.to_string());
                if !self.modules.contains_key(&child) {
                    return None;
                }
                return self.deepest(child, rest);
            }
        };
        self.deepest(base, rest)
    }

    fn deepest(&self, mut base: Vec<String>, rest: &[String]) -> Option<Vec<String>> {
        if !self.modules.contains_key(&base) {
            return None;
        }
        for segment in rest {
            base.push(segment.clone());
            if !self.modules.contains_key(&base) {
                base.pop();
                break;
            }
        }
        Some(base)
    }

    fn name(&self, file: &Path) -> String {
        file.strip_prefix(&self.root).unwrap_or(file).display().to_string()
    }
}

fn parse(file: &Path) -> Result<syn::File> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    syn::parse_file(&text).with_context(|| format!("cannot parse {}", file.display()))
}

/// `#[path = "..."]` on a module declaration.
fn path_attribute(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// The paths a file writes, each with the module it is written in.
struct Refs {
    module: Vec<String>,
    found: Vec<(Vec<String>, Vec<String>, usize)>,
}

impl Refs {
    fn record(&mut self, segments: Vec<String>, line: usize) {
        if !segments.is_empty() {
            self.found.push((self.module.clone(), segments, line));
        }
    }

    /// Every leaf of a `use` tree, as a whole path.
    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut whole = prefix.clone();
                if n.ident != "self" {
                    whole.push(n.ident.to_string());
                }
                self.record(whole, n.ident.span().start().line);
            }
            syn::UseTree::Rename(r) => {
                let mut whole = prefix.clone();
                whole.push(r.ident.to_string());
                self.record(whole, r.ident.span().start().line);
            }
            syn::UseTree::Glob(g) => self.record(prefix.clone(), g.star_token.spans[0].start().line),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, prefix);
                }
            }
        }
    }

    /// Paths in a macro call's tokens: `ident :: ident ...`.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => {
                    self.tokens(g.stream());
                    i += 1;
                }
                TokenTree::Ident(first) => {
                    let line = first.span().start().line;
                    let mut segments = vec![first.to_string()];
                    let mut j = i + 1;
                    while let (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)), Some(TokenTree::Ident(next))) =
                        (trees.get(j), trees.get(j + 1), trees.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segments.push(next.to_string());
                        j += 3;
                    }
                    if segments.len() > 1 {
                        self.record(segments, line);
                    }
                    i = j;
                }
                _ => i += 1,
            }
        }
    }
}

impl<'ast> Visit<'ast> for Refs {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // A child file is read on its own turn; an inline module here.
        if m.content.is_some() {
            self.module.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.module.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&u.tree, &mut Vec::new());
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments = p.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = p.segments.first().map_or(0, |s| s.ident.span().start().line);
        self.record(segments, line);
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.tokens(m.tokens.clone());
        syn::visit::visit_macro(self, m);
    }
}

/// rocev2-user's upward imports: a file using a layer above its own.
fn upward_imports(tree: &Tree, edges: &[Edge]) -> Vec<String> {
    let layer_of = |file: &Path| -> Option<usize> {
        let module = &tree.files.iter().find(|(f, _)| f == file)?.1;
        USER_LAYERS.iter().position(|l| module.first().is_some_and(|m| m == l))
    };
    let mut problems = Vec::new();
    for e in edges {
        let (Some(from), Some(to)) = (layer_of(&e.from), layer_of(&e.to)) else { continue };
        if to < from {
            problems.push(format!(
                "{}:{}: `{}`: {} imports {}, a layer above it (layers, top to bottom: {}; a layer uses only its own and the ones below)",
                tree.name(&e.from),
                e.line,
                e.path,
                USER_LAYERS[from],
                USER_LAYERS[to],
                USER_LAYERS.join(" → "),
            ));
        }
    }
    problems
}

/// Import cycles between a crate's files (strongly connected components of
/// more than one file), each with the imports that close it.
fn cycles(tree: &Tree, edges: &[Edge], crate_name: &str) -> Vec<String> {
    let files: Vec<&PathBuf> = tree.files.iter().map(|(f, _)| f).collect();
    let index = |f: &PathBuf| files.iter().position(|x| *x == f).expect("an edge names a file of the tree");
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); files.len()];
    for e in edges {
        next[index(&e.from)].push(index(&e.to));
    }
    let mut problems = Vec::new();
    for component in strongly_connected(&next).into_iter().filter(|c| c.len() > 1) {
        let mut text = format!("import cycle in {crate_name} between {} files:", component.len());
        for e in edges {
            if component.contains(&index(&e.from)) && component.contains(&index(&e.to)) {
                let _ = write!(text, "\n  {}:{} uses {} (`{}`)", tree.name(&e.from), e.line, tree.name(&e.to), e.path);
            }
        }
        problems.push(text);
    }
    problems
}

/// Tarjan's strongly connected components of a graph given as successor
/// lists.
fn strongly_connected(next: &[Vec<usize>]) -> Vec<Vec<usize>> {
    struct State<'a> {
        next: &'a [Vec<usize>],
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &s.next[v] {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let n = next.len();
    let mut s = State {
        next,
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        counter: 0,
        out: Vec::new(),
    };
    for v in 0..n {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
    }

    /// The tree as it is: no upward import, no cycle.
    #[test]
    fn the_workspace_is_layered() {
        let problems = check(&workspace()).unwrap();
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    /// A copy of a small crate with one upward import and one cycle:
    /// both are found, with file and line.
    #[test]
    fn an_upward_import_and_a_cycle_are_found() {
        let dir = std::env::temp_dir().join(format!("xtask-layers-{}", std::process::id()));
        let src = dir.join("rocev2-user/src");
        let write = |path: &str, text: &str| {
            let p = src.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        write("lib.rs", "pub mod control;\npub mod sys;\n");
        write("control/mod.rs", "pub mod a;\npub mod b;\n");
        write("control/a.rs", "use crate::control::b::B;\npub struct A;\n");
        write("control/b.rs", "pub struct B;\npub fn f() -> super::a::A { super::a::A }\n");
        write("sys/mod.rs", "pub fn g() {\n    let _ = format!(\"{:?}\", crate::control::b::f());\n}\n");
        for other in ["rocev2-common/src/lib.rs", "rocev2-ebpf/src/main.rs", "rocev2-ebpf/src/tools/main.rs"] {
            let p = dir.join(other);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "").unwrap();
        }
        let problems = check(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        let problems = problems.unwrap();
        assert_eq!(problems.len(), 2, "{problems:#?}");
        assert!(
            problems[0].starts_with("rocev2-user/src/sys/mod.rs:2: `crate::control::b::f`: sys imports control"),
            "{}",
            problems[0]
        );
        assert!(problems[1].contains("import cycle in rocev2-user between 2 files"), "{}", problems[1]);
        assert!(
            problems[1].contains("rocev2-user/src/control/a.rs:1 uses rocev2-user/src/control/b.rs"),
            "{}",
            problems[1]
        );
    }
}
