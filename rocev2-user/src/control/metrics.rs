//! Prometheus text exposition of the dataplane counters, and a minimal HTTP
//! server for `rocev2 run --metrics-addr 127.0.0.1:9464`.
//!
//! Metrics (all counters, one sample per port or member):
//! - `rocev2_port_rx_packets_total{port}`, `rocev2_port_rx_bytes_total{port}`
//! - `rocev2_port_forwarded_packets_total{port}`, `rocev2_port_forwarded_bytes_total{port}`
//! - `rocev2_port_forwarded_roce_packets_total{port}`, `rocev2_port_roce_short_bth_packets_total{port}`
//! - `rocev2_port_pass_total{port,reason}`: reason is the counter name without `pass_`
//! - `rocev2_port_drop_total{port,reason}`: reason is the counter name without `drop_`
//! - `rocev2_member_packets_total{group,member,next_hop}`, `rocev2_member_bytes_total{...}`
//!
//! plus the gauges `rocev2_group_members{group,hash}`,
//! `rocev2_group_policy{group,policy,hash,flowlet_*}` (always 1) and
//! `rocev2_hash_seed`; with kernel routes, `rocev2_learned_routes{table}`,
//! `rocev2_learned_host_entries{table}`, `rocev2_learned_groups{table}`,
//! `rocev2_kernel_routes{table,reason}`, `rocev2_route_messages_total{table}`,
//! `rocev2_route_resyncs_total{table}` and
//! `rocev2_route_apply_microseconds{table,quantile}`.

use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, Result};
use rocev2_common::counters::PortCounter;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::watch,
};

use crate::{dataplane::Maps, state::RunState, stats::Snapshot};

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const MAX_REQUEST: usize = 8192;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Escapes a label value: backslash, double quote and newline.
pub fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Metric name and extra label (`reason`) for one port counter.
fn port_metric(counter: PortCounter) -> (String, Option<&'static str>) {
    let name = counter.name();
    if let Some(reason) = name.strip_prefix("pass_") {
        return ("rocev2_port_pass_total".into(), Some(reason));
    }
    if let Some(reason) = name.strip_prefix("drop_") {
        return ("rocev2_port_drop_total".into(), Some(reason));
    }
    let metric = match counter {
        PortCounter::Forwarded => "rocev2_port_forwarded_packets_total".into(),
        PortCounter::ForwardedRoce => "rocev2_port_forwarded_roce_packets_total".into(),
        PortCounter::RoceShortBth => "rocev2_port_roce_short_bth_packets_total".into(),
        _ => format!("rocev2_port_{name}_total"),
    };
    (metric, None)
}

fn help_for(metric: &str, counter: PortCounter) -> String {
    match metric {
        "rocev2_port_pass_total" => "Frames handed to the kernel stack (XDP_PASS), by reason.".into(),
        "rocev2_port_drop_total" => "Frames dropped by the dataplane, by reason.".into(),
        _ => {
            let mut h = counter.help().to_owned();
            if let Some(first) = h.get(..1) {
                h.replace_range(..1, &first.to_uppercase());
            }
            h.push('.');
            h
        }
    }
}

/// A metric family's samples: (labels, value).
type Samples = Vec<(String, u64)>;

/// The snapshot in the Prometheus text format (version 0.0.4).
pub fn render_prometheus(snapshot: &Snapshot) -> String {
    let mut out = String::new();
    // Group the samples by metric so each family gets one HELP/TYPE block.
    // (metric, help, samples) per family, in first-seen order.
    let mut families: Vec<(String, String, Samples)> = Vec::new();
    for &counter in PortCounter::ALL {
        let (metric, reason) = port_metric(counter);
        let idx = match families.iter().position(|(m, _, _)| *m == metric) {
            Some(i) => i,
            None => {
                families.push((metric.clone(), help_for(&metric, counter), Vec::new()));
                families.len() - 1
            }
        };
        for port in &snapshot.ports {
            let value = port.counters.get(counter.name()).copied().unwrap_or(0);
            let labels = match reason {
                Some(r) => format!("port=\"{}\",reason=\"{}\"", escape_label(&port.name), escape_label(r)),
                None => format!("port=\"{}\"", escape_label(&port.name)),
            };
            families[idx].2.push((labels, value));
        }
    }
    for (metric, help, samples) in &families {
        family(&mut out, metric, "counter", help, samples.iter().cloned());
    }

    let member_labels = |group: &str, m: &crate::stats::MemberSnapshot| {
        format!(
            "group=\"{}\",member=\"{}\",next_hop=\"{}\"",
            escape_label(group),
            escape_label(&m.dev),
            escape_label(&m.next_hop)
        )
    };
    let members = || snapshot.groups.iter().flat_map(|g| g.members.iter().map(move |m| (g, m)));
    family(
        &mut out,
        "rocev2_member_packets_total",
        "counter",
        "Packets forwarded to a group member (the hash distribution).",
        members().map(|(g, m)| (member_labels(&g.name, m), m.packets)),
    );
    family(
        &mut out,
        "rocev2_member_bytes_total",
        "counter",
        "Bytes forwarded to a group member.",
        members().map(|(g, m)| (member_labels(&g.name, m), m.bytes)),
    );
    family(
        &mut out,
        "rocev2_group_members",
        "gauge",
        "Usable members of a next-hop group.",
        snapshot.groups.iter().map(|g| {
            (format!("group=\"{}\",hash=\"{}\"", escape_label(&g.name), escape_label(&g.hash)), g.members.len() as u64)
        }),
    );
    family(
        &mut out,
        "rocev2_group_policy",
        "gauge",
        "A next-hop group's policy and its knobs, as labels (always 1).",
        snapshot.groups.iter().map(|g| {
            let mut labels = format!(
                "group=\"{}\",policy=\"{}\",hash=\"{}\"",
                escape_label(&g.name),
                escape_label(&g.policy),
                escape_label(&g.hash)
            );
            if let Some(f) = &g.flowlet {
                labels.push_str(&format!(
                    ",flowlet_gap_us=\"{}\",flowlet_choice=\"{}\",flowlet_boundary=\"{}\"",
                    f.gap_us,
                    escape_label(&f.choice),
                    f.boundary
                ));
            }
            (labels, 1)
        }),
    );
    if !snapshot.egress.is_empty() {
        let port = |e: &crate::stats::EgressSnapshot| format!("port=\"{}\"", escape_label(&e.name));
        for &c in rocev2_common::counters::EgressCounter::ALL {
            family(
                &mut out,
                &format!("rocev2_egress_{}_total", c.name()),
                "counter",
                &format!("{}.", c.help()),
                snapshot.egress.iter().map(|e| (port(e), e.counters.get(c.name()).copied().unwrap_or(0))),
            );
        }
        family(
            &mut out,
            "rocev2_egress_queue_bytes",
            "gauge",
            "Virtual queue depth at the port's last packet.",
            snapshot.egress.iter().map(|e| (port(e), e.queue_bytes)),
        );
        family(
            &mut out,
            "rocev2_egress_queue_high_water_bytes",
            "gauge",
            "Deepest the virtual queue has been.",
            snapshot.egress.iter().map(|e| (port(e), e.queue_high_water_bytes)),
        );
    }
    if !snapshot.classes.is_empty() {
        let class = |c: &crate::stats::ClassSnapshot| format!("class=\"{}\"", escape_label(&c.name));
        family(
            &mut out,
            "rocev2_class_packets_total",
            "counter",
            "Packets matched by a priority class.",
            snapshot.classes.iter().map(|c| (class(c), c.packets)),
        );
        family(
            &mut out,
            "rocev2_class_bytes_total",
            "counter",
            "Bytes matched by a priority class.",
            snapshot.classes.iter().map(|c| (class(c), c.bytes)),
        );
    }
    family(
        &mut out,
        "rocev2_flowlet_entries",
        "gauge",
        "Flows in the flowlet table.",
        [(String::new(), snapshot.flowlet_entries)],
    );
    family(
        &mut out,
        "rocev2_flowlet_evictions_total",
        "counter",
        "Flows evicted from the full flowlet table (LRU).",
        [(String::new(), snapshot.flowlet_evictions())],
    );
    family(&mut out, "rocev2_hash_seed", "gauge", "The hash seed in use.", [(String::new(), u64::from(snapshot.seed))]);
    if let Some(l) = &snapshot.learned {
        let table = format!("table=\"{}\"", l.table);
        family(
            &mut out,
            "rocev2_learned_routes",
            "gauge",
            "Prefixes of the kernel table forwarded in XDP (host entries included).",
            [(table.clone(), l.routes as u64)],
        );
        family(
            &mut out,
            "rocev2_learned_host_entries",
            "gauge",
            "Host entries made from the neighbour table on connected subnets.",
            [(table.clone(), l.hosts as u64)],
        );
        family(
            &mut out,
            "rocev2_learned_groups",
            "gauge",
            "Groups made for the kernel table's next-hop sets.",
            [(table.clone(), l.groups as u64)],
        );
        family(
            &mut out,
            "rocev2_kernel_routes",
            "gauge",
            "Prefixes of the kernel table left to the kernel, by reason.",
            crate::routing::fib::KernelReason::ALL.iter().map(|r| {
                (format!("{table},reason=\"{}\"", r.name()), l.to_kernel.get(r.name()).copied().unwrap_or(0) as u64)
            }),
        );
        family(
            &mut out,
            "rocev2_route_messages_total",
            "counter",
            "Netlink messages from the kernel applied.",
            [(table.clone(), l.messages)],
        );
        family(
            &mut out,
            "rocev2_route_resyncs_total",
            "counter",
            "Full re-reads of the kernel's tables (start, socket overflow).",
            [(table.clone(), l.resyncs)],
        );
        family(
            &mut out,
            "rocev2_route_apply_microseconds",
            "gauge",
            "Kernel change to dataplane updated, over the last 1,000 batches.",
            [
                (format!("{table},quantile=\"0.5\""), l.apply_us_p50),
                (format!("{table},quantile=\"0.99\""), l.apply_us_p99),
            ],
        );
    }
    out
}

/// One metric family: its HELP and TYPE lines, then a sample per
/// (labels, value); empty labels print the bare metric name.
fn family(out: &mut String, metric: &str, kind: &str, help: &str, samples: impl IntoIterator<Item = (String, u64)>) {
    let _ = writeln!(out, "# HELP {metric} {help}");
    let _ = writeln!(out, "# TYPE {metric} {kind}");
    for (labels, value) in samples {
        let _ = if labels.is_empty() {
            writeln!(out, "{metric} {value}")
        } else {
            writeln!(out, "{metric}{{{labels}}} {value}")
        };
    }
}

/// Reads the running instance's state and pinned maps (fresh each scrape,
/// so the endpoint follows member changes and restarts).
pub fn scrape(pin_dir: &Path) -> Result<String> {
    let state = RunState::read(pin_dir)?;
    let maps = Maps::open_pinned(pin_dir)?;
    Ok(render_prometheus(&Snapshot::collect(&maps, &state)?))
}

/// Serves `GET /metrics` on `addr` until `shutdown` turns true (or its
/// sender is dropped). Each scrape reads [`RunState`] and the maps pinned
/// under `pin_dir`. Any other path or method gets 404. The address is bound
/// as given: pass a non-loopback one only if the counters may be public.
pub async fn serve(addr: SocketAddr, pin_dir: PathBuf, shutdown: watch::Receiver<bool>) -> Result<()> {
    let listener = TcpListener::bind(addr).await.with_context(|| format!("cannot listen for metrics on {addr}"))?;
    serve_listener(listener, pin_dir, shutdown).await
}

/// [`serve`] on a listener the caller bound (e.g. to port 0, to learn the port).
pub async fn serve_listener(
    listener: TcpListener,
    pin_dir: PathBuf,
    mut shutdown: watch::Receiver<bool>,
) -> Result<()> {
    loop {
        if *shutdown.borrow() {
            return Ok(());
        }
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // E.g. EMFILE: keep serving rather than take `run` down.
                        eprintln!("rocev2: metrics: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let pin_dir = pin_dir.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, handle(stream, &pin_dir)).await;
                });
            }
        }
    }
}

/// A metrics server on its own thread and tokio runtime, for callers that
/// have no runtime of their own (tests, tools). Stopped on drop.
pub struct MetricsServer {
    addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks a free port; see [`Self::local_addr`]) and
    /// serves `GET /metrics` for the instance pinned at `pin_dir`.
    pub fn start(addr: SocketAddr, pin_dir: PathBuf) -> Result<Self> {
        let listener =
            std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen for metrics on {addr}"))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (shutdown, rx) = watch::channel(false);
        let thread = std::thread::Builder::new().name("rocev2-metrics".into()).spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async move { serve_listener(TcpListener::from_std(listener)?, pin_dir, rx).await })
        })?;
        Ok(Self { addr, shutdown, thread: Some(thread) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving and returns the server's result.
    pub fn stop(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        let _ = self.shutdown.send(true);
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| anyhow::anyhow!("the metrics server thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// Method and path of a request head; None until the head is complete.
fn request_line(head: &[u8]) -> Option<(String, String)> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").or_else(|| head.windows(2).position(|w| w == b"\n\n"))?;
    let text = String::from_utf8_lossy(&head[..end]);
    let mut parts = text.lines().next()?.split_whitespace();
    Some((parts.next()?.to_owned(), parts.next()?.to_owned()))
}

/// Status line, content type and body for one request.
pub fn respond(
    method: &str,
    path: &str,
    scrape: impl FnOnce() -> Result<String>,
) -> (&'static str, &'static str, String) {
    let path = path.split('?').next().unwrap_or("");
    if method != "GET" || path != "/metrics" {
        return ("404 Not Found", "text/plain; charset=utf-8", "not found: try GET /metrics\n".into());
    }
    match scrape() {
        Ok(body) => ("200 OK", CONTENT_TYPE, body),
        Err(e) => (
            "503 Service Unavailable",
            "text/plain; charset=utf-8",
            format!("cannot read the dataplane counters: {e:#}\n"),
        ),
    }
}

// Plain readiness + try_read/try_write: tokio's `net` feature is enough,
// no `io-util` needed.
async fn read_some(stream: &TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        stream.readable().await?;
        match stream.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

async fn write_all(stream: &TcpStream, mut data: &[u8]) -> std::io::Result<()> {
    while !data.is_empty() {
        stream.writable().await?;
        match stream.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn handle(stream: TcpStream, pin_dir: &Path) -> Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let (method, path) = loop {
        let n = read_some(&stream, &mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(line) = request_line(&head) {
            break line;
        }
        if head.len() > MAX_REQUEST {
            write_all(
                &stream,
                b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await?;
            return Ok(());
        }
    };
    let (status, content_type, body) = respond(&method, &path, || scrape(pin_dir));
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    write_all(&stream, response.as_bytes()).await?;
    // Dropping the stream closes it; the client reads to EOF.
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::stats::{GroupSnapshot, MemberSnapshot, PortSnapshot};

    fn snapshot() -> Snapshot {
        let mut counters = BTreeMap::new();
        for (i, c) in PortCounter::ALL.iter().enumerate() {
            counters.insert(c.name(), 10 + i as u64);
        }
        Snapshot {
            ports: vec![
                PortSnapshot { name: "p0".into(), ifindex: 2, counters: counters.clone() },
                PortSnapshot { name: "we\"ird\\name".into(), ifindex: 3, counters },
            ],
            groups: vec![GroupSnapshot {
                name: "spines".into(),
                hash: "qp".into(),
                policy: "flowlet".into(),
                flowlet: Some(crate::state::FlowletKnobs {
                    gap_us: 500,
                    choice: "least-loaded".into(),
                    boundary: true,
                    table_size: 4096,
                }),
                members: vec![
                    MemberSnapshot { dev: "u1".into(), next_hop: "via 10.0.1.2".into(), packets: 7, bytes: 700 },
                    MemberSnapshot {
                        dev: "u2".into(),
                        next_hop: "mac 02:00:00:00:00:02".into(),
                        packets: 9,
                        bytes: 900,
                    },
                ],
            }],
            egress: vec![crate::stats::EgressSnapshot {
                name: "u1".into(),
                rate_bytes_per_sec: 1_250_000_000,
                counters: rocev2_common::counters::EgressCounter::ALL.iter().map(|c| (c.name(), 5)).collect(),
                queue_bytes: 1500,
                queue_high_water_bytes: 90_000,
            }],
            classes: vec![crate::stats::ClassSnapshot { name: "control".into(), packets: 3, bytes: 180 }],
            flowlet_entries: 4,
            seed: 0,
            seed_auto: false,
            learned: Some(crate::routing::LearnedStats {
                table: 254,
                routes: 7,
                to_kernel: [("reject".to_string(), 2)].into_iter().collect(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn egress_class_and_flowlet_metrics() {
        let text = render_prometheus(&snapshot());
        assert!(text.contains("rocev2_egress_ecn_marked_total{port=\"u1\"} 5"), "{text}");
        assert!(text.contains("rocev2_egress_queue_high_water_bytes{port=\"u1\"} 90000"));
        assert!(text.contains("rocev2_class_packets_total{class=\"control\"} 3"));
        assert!(text.contains("rocev2_flowlet_entries 4"));
        assert!(text.contains("rocev2_learned_routes{table=\"254\"} 7"), "{text}");
        assert!(text.contains("rocev2_kernel_routes{table=\"254\",reason=\"reject\"} 2"), "{text}");
        assert!(text.contains("rocev2_kernel_routes{table=\"254\",reason=\"encap\"} 0"), "{text}");
        // flowlet_inserted is 10 + its index on both ports; 4 remain.
        let inserted = 2 * (10 + rocev2_common::counters::PortCounter::FlowletInserted as u64);
        assert!(text.contains(&format!("rocev2_flowlet_evictions_total {}", inserted - 4)));
    }

    #[test]
    fn prometheus_text_has_help_type_and_escaped_samples() {
        let text = render_prometheus(&snapshot());
        let rx = 10 + PortCounter::RxPackets as u64;
        assert!(text.contains(&format!("rocev2_port_rx_packets_total{{port=\"p0\"}} {rx}\n")), "{text}");
        let fwd = 10 + PortCounter::Forwarded as u64;
        assert!(text.contains(&format!("rocev2_port_forwarded_packets_total{{port=\"p0\"}} {fwd}\n")), "{text}");
        let nr = 10 + PortCounter::PassNoRoute as u64;
        assert!(text.contains(&format!("rocev2_port_pass_total{{port=\"p0\",reason=\"no_route\"}} {nr}\n")), "{text}");
        let runt = 10 + PortCounter::DropRunt as u64;
        assert!(text.contains(&format!("rocev2_port_drop_total{{port=\"p0\",reason=\"runt\"}} {runt}\n")), "{text}");
        assert!(text.contains("rocev2_port_rx_packets_total{port=\"we\\\"ird\\\\name\"}"), "{text}");
        assert!(
            text.contains("rocev2_member_packets_total{group=\"spines\",member=\"u1\",next_hop=\"via 10.0.1.2\"} 7\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "rocev2_member_bytes_total{group=\"spines\",member=\"u2\",next_hop=\"mac 02:00:00:00:00:02\"} 900\n"
            ),
            "{text}"
        );
        assert!(text.contains("rocev2_group_members{group=\"spines\",hash=\"qp\"} 2\n"), "{text}");
        assert!(
            text.contains(
                "rocev2_group_policy{group=\"spines\",policy=\"flowlet\",hash=\"qp\",flowlet_gap_us=\"500\",flowlet_choice=\"least-loaded\",flowlet_boundary=\"true\"} 1\n"
            ),
            "{text}"
        );

        // Every family has exactly one HELP and one TYPE line, before its samples,
        // and every sample line is `name{labels} integer`.
        let mut seen_type = std::collections::BTreeSet::new();
        let mut samples = 0;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(seen_type.insert(name.to_owned()), "two TYPE lines for {name}");
                assert!(rest.ends_with(" counter") || rest.ends_with(" gauge"), "{line}");
            } else if line.starts_with("# HELP ") {
            } else {
                let name = &line[..line.find(['{', ' ']).unwrap()];
                assert!(seen_type.contains(name), "sample before its TYPE: {line}");
                let value = line.rsplit(' ').next().unwrap();
                value.parse::<u64>().unwrap_or_else(|_| panic!("{line}"));
                samples += 1;
            }
        }
        let help = text.lines().filter(|l| l.starts_with("# HELP")).count();
        assert_eq!(help, seen_type.len());
        // Ports, members (packets and bytes), group gauges (members and
        // policy), one egress port's counters and two queue gauges, a
        // class (packets and bytes), the two flowlet-table samples, the
        // seed, and the learned-route gauges and counters (routes, hosts,
        // groups, one per kernel reason, messages, resyncs, two quantiles).
        let egress = rocev2_common::counters::EgressCounter::ALL.len() + 2;
        let learned = 3 + crate::routing::fib::KernelReason::ALL.len() + 2 + 2;
        assert_eq!(samples, 2 * PortCounter::ALL.len() + 2 + 2 + 2 + egress + 2 + 2 + 1 + learned);
    }

    #[test]
    fn escape_label_values() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn only_get_metrics_is_served() {
        let ok = || Ok("x 1\n".to_string());
        assert_eq!(respond("GET", "/metrics", ok).0, "200 OK");
        assert_eq!(respond("GET", "/metrics?x=1", ok).1, CONTENT_TYPE);
        assert_eq!(respond("GET", "/", ok).0, "404 Not Found");
        assert_eq!(respond("POST", "/metrics", ok).0, "404 Not Found");
        let failed = respond("GET", "/metrics", || anyhow::bail!("no state"));
        assert!(failed.0.starts_with("503") && failed.2.contains("no state"));
        assert_eq!(request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Some(("GET".into(), "/metrics".into())));
        assert_eq!(request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n"), None);
    }
}
