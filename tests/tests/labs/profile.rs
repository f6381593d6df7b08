//! `rocev2 bench --profile`: a real pipeline loaded as `run` loads it,
//! sampled by a real `perf record`, charged to source lines through the
//! kernel's JIT line table.

use std::process::Command;

use rocev2_tests::{require_root, rocev2_bin};

fn profile(pipeline: &str) -> std::process::Output {
    Command::new(rocev2_bin())
        .args(["bench", "--profile", pipeline, "--profile-seconds", "2"])
        .output()
        .expect("cannot run rocev2 bench")
}

/// (ns, share %, rocev2 line, what runs there) of each table row.
fn rows(text: &str) -> Vec<(f64, f64, String, String)> {
    text.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| ns "))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            let number = |c: &str| c.trim_end_matches('%').parse::<f64>().unwrap_or_else(|_| panic!("{c:?} in {l}"));
            (number(cells[0]), number(cells[1]), cells[2].to_owned(), cells[3].to_owned())
        })
        .collect()
}

/// (file, ns) of the "By file: FILE N ns (P%), ..." line.
fn by_file(text: &str) -> Vec<(String, f64)> {
    let line = text.lines().find_map(|l| l.strip_prefix("By file: ")).expect("a By file line");
    line.trim_end_matches('.')
        .split("), ")
        .map(|part| {
            let (file, rest) = part.split_once(' ').unwrap_or_else(|| panic!("{part:?} in {line}"));
            let ns = rest.split(" ns").next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{part:?}"));
            (file.to_string(), ns)
        })
        .collect()
}

#[test]
fn qp_profile_charges_the_hash_the_route_and_the_redirect() {
    require_root();
    let out = profile("qp");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("### rocev2 qp, IPv4: "), "{text}");
    let rows = rows(&text);
    assert!(rows.len() > 10, "{text}");
    // Every line the qp path runs is rocev2's own (or the rest's sum).
    for (_, _, line, _) in &rows {
        assert!(line.starts_with("rocev2-") || line.ends_with("more lines"), "{line}");
    }
    // Per file from the "By file:" line, which sums every line (the table
    // shows only the busiest): the route lookup is a few ns and can fall
    // below the table's cut when the box is busy.
    let on = |file: &str| by_file(&text).iter().filter(|(f, _)| f == file).map(|(_, ns)| *ns).sum::<f64>();
    assert!(on("rocev2-common/src/hash.rs") > 0.0, "the qp hash is sampled:\n{text}");
    assert!(on("rocev2-ebpf/src/route.rs") > 0.0, "the route lookup is sampled:\n{text}");
    assert!(
        rows.iter().any(|r| r.3.contains("call: kernel `dev_map_redirect`")),
        "the redirect (the array device map's) is a kernel call charged to a line:\n{text}"
    );
    // The rows split the program's ns per packet (samples x 100 µs over
    // the packets run), and with the harness's their shares add to 100 %.
    let after = |marker: &str, end: &str| -> f64 {
        text.split(marker)
            .nth(1)
            .and_then(|t| t.split(end).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{marker:?} in {text}"))
    };
    let harness = after(" in the test-run harness (", " ns");
    let program = after(" in the program and the kernel functions it calls (", " ns per packet");
    let rows_ns: f64 = rows.iter().map(|r| r.0).sum();
    assert!((rows_ns - program).abs() < 0.5 + rows.len() as f64 * 0.05, "{rows_ns} vs {program}");
    let shares: f64 = rows.iter().map(|r| r.1).sum::<f64>() + 100.0 * harness / (program + harness);
    assert!((shares - 100.0).abs() < 0.1 * rows.len() as f64, "{shares}");
}

#[test]
fn flowlet_profile_shows_the_flowlet_table() {
    require_root();
    let out = profile("flowlet");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("### rocev2 flowlet, IPv4: "), "{text}");
    assert!(text.contains("rocev2-ebpf/src/select.rs"), "the flowlet table's code is sampled:\n{text}");
}

#[test]
fn unknown_pipeline_is_refused_with_the_names() {
    require_root();
    let out = profile("ecmp");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "unknown pipeline \"ecmp\" (one of five-tuple, qp, flowlet, full; or floor, or a primitive's program)"
        ),
        "{err}"
    );
}
