//! The book's host bridge tutorial, run as written: every `$ ` command of
//! its `console` blocks, in order, in a lab of this test's own name, and
//! what each prints compared with the lines under it, numbers masked (the
//! frames the kernel's own chatter adds vary). `rocev2 run` is started in
//! the background (the tutorial's second terminal) and compared once it
//! is ready. Beyond the text: with the kernel bridge alone one uplink
//! carries the QPs, with rocev2 all four.

use std::process::Command;

use rocev2_tests::{
    book::{self, assert_shows, mask},
    require_root, rocev2_bin, LabGuard,
};
use rocev2_user::testbed::ecmp_lab::DataplaneProcess;

/// The book's lab "lab" renamed to ours.
fn ours(text: &str, name: &str) -> String {
    text.replace("/run/rocev2/lab-lab/", &format!("/run/rocev2/lab-{name}/"))
        .replace("rocev2-lab", &format!("rocev2-{name}"))
        .replace("Lab \"lab\"", &format!("Lab \"{name}\""))
        .replace("--name lab", &format!("--name {name}"))
        .replace(" lab-", &format!(" {name}-"))
        .replace("(lab-", &format!("({name}-"))
}

/// The uplinks `lab stats` printed with frames on them.
fn uplinks_used(stats: &str) -> usize {
    stats
        .lines()
        .filter(|l| l.starts_with('u'))
        .filter(|l| l.split_whitespace().nth(2).and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n > 0))
        .count()
}

#[test]
fn the_book_host_bridge_tutorial_prints_what_the_book_shows() {
    require_root();
    let name = format!("hb{}", std::process::id() % 100_000);
    let _guard = LabGuard(name.clone());
    let steps = book::console_steps("tutorial-host-bridge.md");
    assert!(steps.len() >= 9, "the host bridge tutorial has {} commands", steps.len());
    let mut run = None;
    let mut lab_stats = Vec::new();
    for step in steps {
        let command = ours(&step.command, &name);
        let mut args: Vec<String> = command.split_whitespace().map(str::to_string).collect();
        assert_eq!(args.remove(0), "rocev2", "{}", step.command);
        if args[0] == "lab" {
            args.splice(2..2, ["--name".to_string(), name.clone()]);
        }
        let expected: Vec<String> = step.expected.iter().map(|l| ours(l, &name)).collect();
        if args.get(2).is_some_and(|a| a == "run") {
            let mut cmd = Command::new(rocev2_bin());
            cmd.args(&args);
            let process = DataplaneProcess::spawn(cmd).expect("rocev2 run reaches ready");
            assert_shows(&step.command, &expected, &process.output(), mask);
            run = Some(process);
            continue;
        }
        if args[0] == "lab" && args[1] == "down" {
            // Ctrl-C in the tutorial's first terminal.
            run.take().expect("run was started").stop().expect("rocev2 run stops cleanly");
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
        assert_shows(&step.command, &expected, &stdout, mask);
        if args[0] == "lab" && args[1] == "stats" {
            lab_stats.push(stdout);
        }
    }
    assert_eq!(lab_stats.len(), 2, "the tutorial runs lab stats twice");
    assert_eq!(uplinks_used(&lab_stats[0]), 1, "the kernel bridge alone: one uplink\n{}", lab_stats[0]);
    assert_eq!(uplinks_used(&lab_stats[1]), 4, "rocev2: every uplink\n{}", lab_stats[1]);
}
