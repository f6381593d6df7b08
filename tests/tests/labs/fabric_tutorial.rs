//! The book's fabric tutorial, run as written: every `$ ` command of its
//! `console` blocks, in order, in a lab of this test's own name, and what
//! each prints compared with the lines under it. The per-link tables and
//! the simulator's numbers are compared as printed (only timings masked):
//! a change to the hash, the bucket tables or the fabric's wiring that
//! moves a single packet makes the tutorial stale and fails here. Start-up,
//! status and teardown lines are compared with their numbers masked (PIDs,
//! times, counters of the kernel's own chatter).

use std::process::Command;

use rocev2_tests::{
    book::{self, assert_shows, mask, squeeze},
    require_root, rocev2_bin, LabGuard,
};

/// The book's lab "lab" renamed to ours.
fn ours(text: &str, name: &str) -> String {
    text.replace("/run/rocev2/lab-lab/", &format!("/run/rocev2/lab-{name}/"))
        .replace("frr-lab-", &format!("frr-{name}-"))
        .replace("Fabric \"lab\"", &format!("Fabric \"{name}\""))
        .replace("Lab \"lab\"", &format!("Lab \"{name}\""))
        .replace("--name lab", &format!("--name {name}"))
        .replace(" lab-", &format!(" {name}-"))
}

/// Timings masked ("in 0.2 s"), everything else as printed.
fn timings_masked(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let timing = words.get(i + 1) == Some(&"s") && w.parse::<f64>().is_ok();
        out.push(if timing { "T" } else { w });
    }
    squeeze(&out.join(" "))
}

#[test]
fn the_book_fabric_tutorial_prints_what_the_book_shows() {
    require_root();
    let name = format!("ft{}", std::process::id() % 100_000);
    let _guard = LabGuard(name.clone());
    let steps = book::console_steps("tutorial-fabric.md");
    assert!(steps.len() >= 10, "the fabric tutorial has {} commands", steps.len());
    for step in steps {
        let mut args: Vec<String> = step.command.split_whitespace().map(str::to_string).collect();
        assert_eq!(args.remove(0), "rocev2", "{}", step.command);
        if args[0] == "lab" {
            args.splice(2..2, ["--name".to_string(), name.clone()]);
        }
        let out = Command::new(rocev2_bin()).args(&args).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "`{}` failed ({}):\n{stdout}{}",
            step.command,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let expected: Vec<String> = step.expected.iter().map(|l| ours(l, &name)).collect();
        let exact = matches!(args[0].as_str(), "entropy") || args.get(1).is_some_and(|a| a == "traffic");
        assert_shows(&step.command, &expected, &stdout, if exact { timings_masked } else { mask });
    }
    rocev2_tests::assert_lab_namespaces_gone(&name);
}
