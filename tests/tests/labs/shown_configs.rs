//! Every config a user is shown or given passes `rocev2 check --offline`:
//! each ```` ```toml ```` block of README.md and of every book chapter, every
//! `.toml` file under `packaging/`, and the example of the shipped man page
//! `rocev2.toml(5)`. A block that is deliberately a fragment (`members = [ …
//! ]`, one table of a larger file) says so in its info string: ```` ```toml
//! partial ````. Markdown renderers take the first word as the language (so
//! it is still highlighted as TOML); this test reads the second.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use rocev2_tests::rocev2_bin;

/// A config shown somewhere: where (file and line) and its text.
struct Shown {
    place: String,
    text: String,
}

/// The ```toml blocks of `markdown` (read from `file`): the complete ones,
/// and how many are marked `partial`. Any other word after `toml` fails.
fn toml_blocks(file: &str, markdown: &str) -> (Vec<Shown>, usize) {
    let (mut complete, mut partial) = (Vec::new(), 0);
    let mut lines = markdown.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let Some(info) = line.trim().strip_prefix("```toml") else { continue };
        let text: String =
            lines.by_ref().take_while(|(_, l)| l.trim() != "```").map(|(_, l)| format!("{l}\n")).collect();
        match info.trim() {
            "" => complete.push(Shown { place: format!("{file}:{}", n + 1), text }),
            "partial" => partial += 1,
            other => panic!("{file}:{}: ```toml {other}: the only mark this test knows is `partial`", n + 1),
        }
    }
    (complete, partial)
}

/// The EXAMPLE section of a man page, roff escapes undone.
fn man_example(page: &str) -> String {
    let example = page.split(".SH EXAMPLE\n.nf\n").nth(1).and_then(|rest| rest.split("\n.fi\n").next());
    let example = example.expect("the man page has an EXAMPLE section in .nf/.fi");
    example
        .lines()
        .map(|l| l.strip_prefix("\\&").unwrap_or(l).replace("\\-", "-").replace("\\e", "\\") + "\n")
        .collect()
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[test]
fn every_config_in_the_readme_the_book_and_the_package_passes_check_offline() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut shown = Vec::new();
    let mut partial = 0;

    let mut markdown = vec![root.join("README.md")];
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(root.join("docs/src"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    chapters.sort();
    markdown.extend(chapters);
    for path in &markdown {
        let name = path.strip_prefix(&root).unwrap().display().to_string();
        let (complete, fragments) = toml_blocks(&name, &std::fs::read_to_string(path).unwrap());
        shown.extend(complete);
        partial += fragments;
    }

    let mut packaged = Vec::new();
    files_under(&root.join("packaging"), &mut packaged);
    packaged.sort();
    for path in packaged.iter().filter(|p| p.extension().is_some_and(|e| e == "toml")) {
        let place = path.strip_prefix(&root).unwrap().display().to_string();
        shown.push(Shown { place, text: std::fs::read_to_string(path).unwrap() });
    }
    let page = rocev2_user::control::config::reference::man_page(env!("CARGO_PKG_VERSION"));
    shown.push(Shown { place: "man rocev2.toml (EXAMPLE)".into(), text: man_example(&page) });

    // Not vacuous: the front page's config, the package's and the man
    // page's are among them, and fragments are the exception.
    assert!(shown.iter().any(|s| s.place.starts_with("README.md:")), "README.md shows a config");
    assert!(shown.iter().any(|s| s.place == "packaging/rocev2.toml"), "the package ships a config");
    assert!(shown.iter().filter(|s| s.place.starts_with("docs/src/")).count() >= 3, "the book shows configs");
    assert!(partial < shown.len(), "{partial} fragments, {} whole configs", shown.len());

    let dir = std::env::temp_dir().join(format!("rocev2-shown-configs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut failed = Vec::new();
    for config in &shown {
        // Named after where it is shown, so the error's file:line says it too.
        let file = dir.join(format!("{}.toml", config.place.replace(['/', ':', ' ', '(', ')'], "-")));
        std::fs::write(&file, &config.text).unwrap();
        let out = Command::new(rocev2_bin()).args(["check", "--offline", "--config"]).arg(&file).output().unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !said.contains(": OK (") {
            failed.push(format!("{}: {}{}", config.place, said, String::from_utf8_lossy(&out.stderr)));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        failed.is_empty(),
        "`rocev2 check --offline` refused {} of {} configs shown to users (fix the config, or mark a deliberate fragment ```toml partial):\n{}",
        failed.len(),
        shown.len(),
        failed.join("\n")
    );
}

/// The mark is read, and a mark this test does not know fails rather than
/// pass a block unchecked.
#[test]
fn toml_blocks_are_complete_unless_marked_partial() {
    let md = "a\n```toml\n[[port]]\nname = \"e\"\n```\n```toml partial\nmembers = [ … ]\n```\n```sh\nx\n```\n";
    let (complete, partial) = toml_blocks("x.md", md);
    assert_eq!((complete.len(), partial), (1, 1));
    assert_eq!((complete[0].place.as_str(), complete[0].text.as_str()), ("x.md:2", "[[port]]\nname = \"e\"\n"));
    let typo = std::panic::catch_unwind(|| toml_blocks("x.md", "```toml partal\nx\n```\n"));
    assert!(typo.is_err(), "an unknown mark is an error");
    assert_eq!(man_example(".SH EXAMPLE\n.nf\n\\&.a = \"x\\-y\\e\"\n.fi\n"), ".a = \"x-y\\\"\n");
}
