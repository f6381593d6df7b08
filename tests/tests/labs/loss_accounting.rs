//! Issue 25: loss is counted where it happens. A redirect the egress
//! device refuses after the XDP program returned is counted per egress
//! port (not forwarded), and a capture that drops frames is reported as
//! the observer's loss, not the switch's.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    process::Command,
    time::Duration,
};

use rocev2_tests::{require_root, rocev2_bin};
use rocev2_user::{
    control::metrics::MetricsServer,
    testbed::ecmp_lab::{lab_frames, CaptureOptions, EcmpLab, Family},
};

fn metrics(addr: std::net::SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to the metrics server");
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

fn sample(body: &str, key: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no sample {key} in\n{body}"))
}

#[test]
fn a_redirect_the_egress_device_refuses_is_counted_per_port_not_forwarded() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let config = lab.write_config("qp").unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    // `run` turned GRO on for up0, the peer of its egress u1, so that
    // redirects into u1 are delivered. Off again, u1's peer has no NAPI and
    // the kernel drops every frame redirected into u1 after the XDP
    // program returned XDP_REDIRECT.
    lab.uplinks[0].exec(&["ethtool", "-K", "up0", "gro", "off"]).unwrap();
    // No arrival probes: theirs is an XDP program, which gives up0 NAPI.
    let options = CaptureOptions { without_arrival_probes: true, ..Default::default() };
    let report = lab.send_and_capture_with(64, 4, &[Family::V4], options).unwrap();
    assert_eq!(report.uplinks[0].packets, 0, "nothing can arrive through u1:\n{}", report.render());
    let delivered = report.uplinks[1].packets;
    let refused = report.sent - delivered;
    assert!(refused > 0 && delivered > 0, "64 QPs spread over both uplinks:\n{}", report.render());

    let pin_dir = lab.pin_dir();
    let stats = |json: bool| {
        let mut cmd = Command::new(rocev2_bin());
        cmd.args(["stats", "--pin-dir", pin_dir.to_str().unwrap()]);
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let out = stats(true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let per_port: Vec<(String, u64)> = json["egress_refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["dev"].as_str().unwrap().to_owned(), r["frames"].as_u64().unwrap()))
        .collect();
    assert_eq!(per_port, vec![("u1".to_owned(), refused), ("u2".to_owned(), 0)], "{json:#}");
    let p0 = &json["ports"][0]["counters"];
    assert_eq!(p0["drop_egress_refused"], refused, "{json:#}");
    // Forwarded is what the egress devices took: exactly what arrived.
    assert_eq!(p0["forwarded"], delivered, "{json:#}");
    let warning = String::from_utf8_lossy(&out.stderr);
    assert!(warning.contains(&format!("{refused} redirected frames were LOST")) && warning.contains("u1"), "{warning}");
    let text = String::from_utf8_lossy(&stats(false).stdout).into_owned();
    assert!(text.contains("REFUSED FRAMES") && text.contains("warning:"), "{text}");
    println!("MEASURED: {refused} of {} frames refused by u1, {delivered} delivered through u2\n{text}", report.sent);

    let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), pin_dir.clone()).unwrap();
    let body = metrics(server.local_addr());
    server.stop().unwrap();
    assert_eq!(sample(&body, "rocev2_egress_refused_frames_total{egress=\"u1\"}"), refused, "{body}");
    assert_eq!(sample(&body, "rocev2_egress_refused_frames_total{egress=\"u2\"}"), 0, "{body}");
    assert_eq!(sample(&body, "rocev2_port_drop_total{port=\"p0\",reason=\"egress_refused\"}"), refused, "{body}");
    assert_eq!(sample(&body, "rocev2_port_forwarded_packets_total{port=\"p0\"}"), delivered, "{body}");
    let output = dataplane.stop().unwrap();
    assert!(!output.contains("are not counted"), "{output}");
}

/// A capture made to drop: each uplink's socket gets the smallest receive
/// buffer the kernel allows (a few frames) and its reader sleeps through
/// the whole stream, as a capture starved of CPU on a busy machine does.
/// The frames still arrive (the arrival probes count them in XDP, before
/// any socket); the report puts the loss on the observer, not the switch,
/// and the socket's own drop counter (PACKET_STATISTICS) confirms it.
#[test]
fn a_capture_that_drops_under_load_is_reported_as_the_observers_loss() {
    require_root();
    let lab = EcmpLab::create(2).unwrap();
    let config = lab.write_config("qp").unwrap();
    let dataplane = lab.start_dataplane(&rocev2_bin(), &config).unwrap();
    let options = CaptureOptions { receive_buffer: Some(1), stall: Duration::from_millis(800), ..Default::default() };
    let capture = lab.start_capture_with(options).unwrap();
    let stream = lab.start_stream(lab_frames(64, 1, &[Family::V4]), 4_000).unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let sent = stream.stop().unwrap();
    let report = capture.finish(sent).unwrap();
    dataplane.stop().unwrap();
    let loss = report.loss();
    println!("MEASURED: a starved capture: {}", loss.describe());
    assert_eq!(loss.switch_lost(), 0, "{}", report.render());
    assert_eq!(loss.arrived, sent, "{}", report.render());
    assert!(loss.observer_lost() > sent / 2, "the capture must have missed most frames:\n{}", report.render());
    assert!(loss.observer_dropped >= loss.observer_lost(), "the socket counts its drops:\n{}", report.render());
    assert!(loss.check().is_ok(), "the observer's loss is not the switch's");
    assert!(loss.describe().contains("not the switch's loss"), "{}", loss.describe());
    assert!(report.render().contains("the capture missed"), "{}", report.render());
}
