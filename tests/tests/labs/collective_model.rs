//! The book's chapter on the collective model, replayed: every `$ rocev2
//! entropy` command of its `console` blocks, run as written, prints the
//! lines under it (alignment aside; `…` stands for lines the book leaves
//! out). The model is deterministic, so the numbers are compared as they
//! are: a change to the model that moves them changes the book too. No
//! root and no namespace: the model runs offline.

use std::process::Command;

use rocev2_tests::{
    book::{self, assert_shows, squeeze},
    rocev2_bin,
};

#[test]
fn the_books_collective_model_chapter_prints_what_the_book_shows() {
    let text = book::chapter("collective-model.md");
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "```console" {
            continue;
        }
        for l in lines.by_ref().take_while(|l| l.trim() != "```") {
            match l.strip_prefix("$ ") {
                Some(command) => steps.push((command.to_string(), Vec::new())),
                None => steps.last_mut().expect("a console block starts with a command").1.push(l.to_string()),
            }
        }
    }
    assert_eq!(steps.len(), 4, "the lab-scale scorecard and three paper-scale modes");
    for (command, expected) in &steps {
        let args: Vec<&str> = command.split_whitespace().collect();
        assert_eq!(args[..2], ["rocev2", "entropy"], "{command}");
        let out = Command::new(rocev2_bin()).args(&args[1..]).output().unwrap();
        assert!(out.status.success(), "{command}: {}", String::from_utf8_lossy(&out.stderr));
        assert_shows(command, expected, &String::from_utf8_lossy(&out.stdout), squeeze);
    }
}
