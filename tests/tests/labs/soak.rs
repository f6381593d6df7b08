//! Issue 25: the churn soak. Two minutes of `rocev2 lab soak` on a BGP
//! fabric under a busy loop: withdrawals, link cuts, FRR kill -9, reloads,
//! upgrades and `run` kill -9 + restart, with a sequence-checked stream
//! between every pair of racks counted where it lands; nothing may be lost
//! beyond what the kernel itself would have lost.

use std::process::Command;

use rocev2_tests::{require_root, rocev2_bin, LabGuard};

#[test]
fn a_two_minute_churn_soak_loses_nothing_the_kernel_would_not() {
    require_root();
    let name = format!("sk{:x}", std::process::id() % 0xFFFFF);
    let _guard = LabGuard(name.clone());
    let out = Command::new(rocev2_bin())
        .args(["lab", "soak", "--name", &name, "--minutes", "2", "--json"])
        .output()
        .expect("run rocev2 lab soak");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("soak printed no report ({e}): {}\nstderr:\n{stderr}", out.status));
    let n = |key: &str| report[key].as_u64().unwrap_or_else(|| panic!("{key} in {report:#}"));
    let events = report["events"].as_array().expect("events");
    let table: Vec<String> = events
        .iter()
        .map(|e| {
            format!(
                "{} {} {} lost {} (kernel {}, no path {}, counted {})",
                e["at_s"],
                e["kind"],
                e["target"],
                e["lost"],
                e["kernel_would_lose"],
                e["sent_without_path"],
                e["counted"]
            )
        })
        .collect();
    let context = format!("{}\nflows with loss: {}\nstderr:\n{stderr}", table.join("\n"), report["flows_with_loss"]);

    // Traffic flowed the whole time and every frame is accounted for.
    assert!(n("sent") > 100_000, "2 min x 24 flows x 200 pps: {context}");
    assert_eq!(n("sent"), n("arrived") + n("lost"), "sent = arrived + lost: {context}");
    assert_eq!(n("lost"), n("kernel_would_lose") + n("beyond_kernel"), "{context}");
    assert_eq!(n("probe_events_lost"), 0, "every gap was reported: {context}");
    // Every kind of event happened, and the command says whether it passed.
    let kinds: Vec<&str> = report["kinds_exercised"].as_array().unwrap().iter().filter_map(|k| k.as_str()).collect();
    assert_eq!(
        kinds,
        ["withdraw", "advertise", "link-down", "link-up", "frr-restart", "reload", "upgrade", "kill-restart"],
        "{context}"
    );
    assert!(events.len() > kinds.len(), "a row per event after the steady one: {context}");
    assert_eq!(n("beyond_kernel"), 0, "lost beyond what the kernel would have lost: {context}");
    assert_eq!(n("unexplained"), 0, "every loss has a cause: {context}");
    assert!(n("kernel_would_lose") <= n("sent_without_path").max(n("counted")), "{context}");
    assert!(out.status.success(), "the soak passed, so it exits 0: {context}");
}
