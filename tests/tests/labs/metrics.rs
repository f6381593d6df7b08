//! The Prometheus endpoint against a real running dataplane: the namespace
//! lab of the `ecmp` module, some RoCEv2 traffic, then GET /metrics.

use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::TcpStream,
    time::Duration,
};

use rocev2_tests::{require_root, rocev2_bin};
use rocev2_user::{
    control::metrics::MetricsServer,
    testbed::ecmp_lab::{EcmpLab, Family},
};

fn get(addr: std::net::SocketAddr, path: &str) -> String {
    get_with(addr, "GET", path)
}

fn get_with(addr: std::net::SocketAddr, method: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to the metrics server");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// `name{labels}` -> value for every sample line.
fn samples(body: &str) -> BTreeMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line {l:?}"));
            (key.to_owned(), value.parse().unwrap_or_else(|_| panic!("bad value in {l:?}")))
        })
        .collect()
}

#[test]
fn metrics_endpoint_serves_the_running_dataplanes_counters() {
    require_root();
    let lab = EcmpLab::create(2).expect("build the lab");
    let config = lab.write_config("qp").unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).expect("start rocev2 run");
    let report = lab.send_and_capture(16, 2, &[Family::V4]).expect("send and capture");
    rocev2_tests::assert_no_switch_loss(&report, "the traffic arrives");

    let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), lab.pin_dir()).expect("start the server");
    let response = get(server.local_addr(), "/metrics");
    let not_found = get(server.local_addr(), "/other");
    let head_only = get_with(server.local_addr(), "HEAD", "/metrics");
    server.stop().expect("server stops cleanly");
    dataplane.stop().expect("rocev2 run stops");

    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP head and body");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.to_ascii_lowercase().contains("content-type: application/openmetrics-text; version=1.0.0"), "{head}");
    assert!(body.contains("# TYPE rocev2_port_rx_packets counter"), "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");
    let s = samples(body);
    assert!(s["rocev2_port_rx_packets_total{port=\"p0\"}"] >= report.sent as f64, "{body}");
    assert!(s["rocev2_port_forwarded_packets_total{port=\"p0\"}"] >= report.sent as f64, "{body}");
    assert!(s.contains_key("rocev2_port_pass_total{port=\"p0\",reason=\"no_route\"}"), "{body}");
    assert!(s.contains_key("rocev2_port_drop_total{port=\"p0\",reason=\"runt\"}"), "{body}");
    let member_packets: f64 =
        s.iter().filter(|(k, _)| k.starts_with("rocev2_member_packets_total{group=\"spines\"")).map(|(_, v)| v).sum();
    assert_eq!(member_packets, report.sent as f64, "{body}");
    // The service's own: its build, each configured member up, its process.
    assert_eq!(s.keys().filter(|k| k.starts_with("rocev2_build_info{version=")).count(), 1, "{body}");
    let up: Vec<f64> =
        s.iter().filter(|(k, _)| k.starts_with("rocev2_member_up{group=\"spines\"")).map(|(_, v)| *v).collect();
    assert_eq!(up, [1.0, 1.0], "{body}");
    assert_eq!(s["rocev2_config_last_reload_successful"], 1.0, "{body}");
    assert!(s["process_start_time_seconds"] > 1.6e9 && s["process_resident_memory_bytes"] > 0.0, "{body}");
    // HEAD: the same answer without the body.
    let (head_head, head_body) = head_only.split_once("\r\n\r\n").expect("HTTP head");
    assert!(head_head.starts_with("HTTP/1.1 200") && head_body.is_empty(), "{head_only}");
    assert_eq!(s.keys().filter(|k| k.starts_with("rocev2_member_bytes_total{")).count(), 2, "{body}");
    assert!(not_found.starts_with("HTTP/1.1 404"), "{not_found}");
}
