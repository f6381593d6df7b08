//! What a new user runs into in the first hour: a command without
//! privileges names the missing one, `check` finds a missing interface in
//! the namespace it is given, a mistyped `--netns` gets a suggestion, and
//! `stats` shows each group's policy. Each test makes its own lab.

use std::{
    path::Path,
    process::{Command, Output},
};

use rocev2_tests::{require_root, rocev2_bin, LabGuard};
use rocev2_user::testbed::ecmp_lab::EcmpLab;

fn rocev2(args: &[&str]) -> Output {
    Command::new(rocev2_bin()).args(args).output().expect("run rocev2")
}

/// `rocev2 ARGS` as user nobody with no capabilities.
fn rocev2_as_nobody(args: &[&str]) -> Output {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(rocev2_bin())
        .args(args)
        .output()
        .expect("setpriv (util-linux) runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn make_readable(config: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(config.parent().unwrap(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(config, std::fs::Permissions::from_mode(0o644)).unwrap();
}

#[test]
fn without_privileges_stats_and_lab_up_name_what_is_missing() {
    require_root();
    let lab = EcmpLab::create(1).unwrap();
    let config = lab.write_config("qp").unwrap();
    make_readable(&config);
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let pin_dir = lab.pin_dir().display().to_string();

    // While `run` runs: the problem is the privilege, not a missing `run`.
    for args in [vec!["stats", "--pin-dir", &pin_dir], vec!["stats", "--config", config.to_str().unwrap()]] {
        let out = rocev2_as_nobody(&args);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} as nobody succeeded: {err}");
        assert!(err.contains("`rocev2 stats` needs CAP_DAC_OVERRIDE"), "{args:?}: {err}");
        assert!(err.contains(&pin_dir) && err.contains("run it as root"), "{args:?}: {err}");
        assert!(err.contains("setcap cap_dac_override+ep"), "how to grant it: {err}");
        assert!(!err.contains("is `rocev2 run` running"), "{args:?}: {err}");
    }
    // As root the same command works, so the message above was about privileges.
    let out = rocev2(&["stats", "--pin-dir", &pin_dir]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    dataplane.stop().unwrap();

    let name = format!("p{}", std::process::id() % 10_000_000);
    let _guard = LabGuard(name.clone());
    let out = rocev2_as_nobody(&["lab", "up", "--name", &name]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "lab up as nobody succeeded: {err}");
    assert!(err.contains("`rocev2 lab up` needs CAP_SYS_ADMIN and CAP_NET_ADMIN"), "{err}");
    assert!(err.contains("network namespaces") && err.contains("run it as root"), "{err}");
    assert!(!err.contains("os error"), "a bare errno instead of the privilege: {err}");
    let listed = text(&Command::new("ip").args(["netns", "list"]).output().unwrap().stdout);
    assert!(!listed.contains(&format!("{name}-rtsw")), "nothing was made: {listed}");
}

#[test]
fn check_looks_for_interfaces_in_the_namespace_it_is_given() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let good = lab.write_config("qp").unwrap();
    let sw = lab.switch.name();

    // In the switch's namespace every interface is there.
    let out = rocev2(&["--netns", sw, "check", "--config", good.to_str().unwrap()]);
    let said = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(said.contains(": OK (1 ports, 1 groups, 2 members, 2 routes;"), "{said}");
    assert!(said.contains(&format!("interfaces found in network namespace \"{sw}\"")), "{said}");

    // In the host's namespace they are not: the error says where it looked.
    let out = rocev2(&["check", "--config", good.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "check found the lab's p0 outside the lab: {}", text(&out.stdout));
    assert!(err.contains("port[0].name: no interface named p0"), "{err}");
    // (The host's, or in a container the one rocev2 was started in.)
    assert!(err.contains("; looked in the ") && err.contains("--netns NAME"), "{err}");

    // A member that does not exist, in the namespace that is right.
    let bad = lab.config("qp").replace("dev = \"u2\"", "dev = \"u9\"");
    let line = bad.lines().position(|l| l.contains("u9")).unwrap() + 1;
    let bad = lab.write_config_text("bad", &bad).unwrap();
    let out = rocev2(&["--netns", sw, "check", "--config", bad.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "check accepted a missing interface: {}", text(&out.stdout));
    assert!(err.contains(&format!("{}:{line}:", bad.display())), "file and line: {err}");
    assert!(err.contains("group[0].members[1].dev: no interface named u9"), "{err}");
    assert!(err.contains(&format!("looked in network namespace \"{sw}\" (`ip -n {sw} link`")), "{err}");

    // `run` says the same.
    let out = rocev2(&["--netns", sw, "run", "--config", bad.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("looked in network namespace \"{sw}\"")), "{err}");

    // --offline checks the file only.
    let out = rocev2(&["check", "--offline", "--config", bad.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("interfaces not looked up (--offline)"));

    // A mistyped namespace gets the close match.
    let typo = format!("{}x", &sw[..sw.len() - 1]);
    let out = rocev2(&["--netns", &typo, "check", "--config", good.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("network namespace \"{typo}\" not found")), "{err}");
    assert!(err.contains(&format!("did you mean \"{sw}\"?")), "{err}");
}

#[test]
fn stats_shows_each_groups_policy_and_knobs() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let flowlet = lab
        .config("qp")
        .replace("name = \"spines\"\n", "name = \"spines\"\npolicy = \"flowlet\"\nflowlet_gap_us = 500\n");
    assert!(flowlet.contains("flowlet_gap_us"), "the group section moved: {flowlet}");
    let config = lab.write_config_text("flowlet", &flowlet).unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let pin_dir = lab.pin_dir().display().to_string();

    let out = rocev2(&["stats", "--pin-dir", &pin_dir]);
    let said = text(&out.stdout);
    let json = rocev2(&["stats", "--json", "--pin-dir", &pin_dir]);
    dataplane.stop().unwrap();

    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(said.contains("GROUP spines (hash qp, flowlet gap 500us)\n"), "{said}");
    assert!(json.status.success(), "{}", text(&json.stderr));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let group = &json["groups"][0];
    assert_eq!(group["policy"], "flowlet", "{json}");
    assert_eq!(group["flowlet"]["gap_us"], 500, "{json}");
    assert_eq!(group["flowlet"]["choice"], "rehash", "{json}");
}
