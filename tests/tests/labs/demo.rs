//! `rocev2 demo`, the quick start's first command, prints what the front
//! page (README.md, included in the book's quick start) shows, line for
//! line: the hash and the lab are deterministic, so are the numbers.

use std::process::Command;

use rocev2_tests::{
    book::{self, assert_shows, squeeze},
    require_root, rocev2_bin,
};

#[test]
fn the_demo_prints_what_the_front_page_shows() {
    require_root();
    let page = book::front_page();
    let block = page
        .split("What the demo prints")
        .nth(1)
        .and_then(|rest| rest.split("```text\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("README.md shows the demo's output in a text block");
    let expected: Vec<String> = block.lines().map(str::to_string).collect();
    let out = Command::new(rocev2_bin()).arg("demo").output().expect("run rocev2 demo");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "rocev2 demo failed:\n{printed}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_shows("rocev2 demo", &expected, &printed, squeeze);
    assert!(expected.len() > 20, "the whole output is shown: {expected:?}");
}
