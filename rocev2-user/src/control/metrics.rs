//! Prometheus exposition of the dataplane counters (through
//! `prometheus-client`, OpenMetrics text), and the HTTP endpoint (hyper) for
//! `rocev2 run --metrics-addr 127.0.0.1:9464`.
//!
//! Metrics (all counters, one sample per port or member):
//! - `rocev2_port_rx_packets_total{port}`, `rocev2_port_rx_bytes_total{port}`
//! - `rocev2_port_forwarded_packets_total{port}`, `rocev2_port_forwarded_bytes_total{port}`
//! - `rocev2_port_forwarded_roce_packets_total{port}`, `rocev2_port_roce_short_bth_packets_total{port}`
//! - `rocev2_port_pass_total{port,reason}`: reason is the counter name without `pass_`
//! - `rocev2_port_drop_total{port,reason}`: reason is the counter name without `drop_`
//! - `rocev2_member_packets_total{group,member,next_hop}`, `rocev2_member_bytes_total{...}`
//! - `rocev2_egress_refused_frames_total{egress}`: redirected frames the
//!   egress device refused after the XDP program (lost; not forwarded)
//! - with telemetry, the members' transport sums (`rocev2_member_naks_total`, ...);
//!   in a `transport_aware` group also `rocev2_member_health_score` and
//!   `rocev2_member_demoted` (gauges), `rocev2_member_demotions_total`,
//!   `rocev2_member_restores_total`
//!
//! plus the gauges `rocev2_group_members{group,hash}`,
//! `rocev2_group_policy{group,policy,hash,flowlet_*,transport_aware knobs}` (always 1) and
//! `rocev2_hash_seed`; with kernel routes, `rocev2_learned_routes{table}`,
//! `rocev2_learned_host_entries{table}`, `rocev2_learned_groups{table}`,
//! `rocev2_kernel_routes{table,reason}`, `rocev2_route_messages_total{table}`,
//! `rocev2_route_resyncs_total{table}` and
//! `rocev2_route_apply_microseconds{table,quantile}`; with `[bridge]`,
//! `rocev2_bridge_ports{bridge,state}`, `rocev2_bridge_fdb_entries{bridge,kind}`
//! (gauges), `rocev2_bridge_ageing_refreshes_total{bridge}` and
//! `rocev2_bridge_messages_total{bridge}`.
//!
//! The service itself: `rocev2_build_info{version,commit}` (always 1),
//! `rocev2_config_reloads_total`, `rocev2_config_reload_failures_total`,
//! `rocev2_config_last_reload_successful`,
//! `rocev2_config_last_reload_success_timestamp_seconds`,
//! `rocev2_member_up{group,member,next_hop}` (every configured member, 1 or
//! 0) and the usual `process_*` (start time, CPU, resident memory, fds).
//! `packaging/grafana-dashboard.json` graphs them (a test checks it names
//! only these metrics).
//!
//! Every scrape reads the pinned maps afresh and encodes one [`Snapshot`]:
//! the counters live in the kernel, so the registry holds no state of its
//! own, only a collector over that snapshot.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, Result};
use http_body_util::Full;
use hyper::{
    body::{Bytes, Incoming},
    header::CONTENT_TYPE as CONTENT_TYPE_HEADER,
    server::conn::http1,
    service::service_fn,
    Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _, MetricEncoder},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    registry::Registry,
};
use rocev2_common::counters::PortCounter;
use tokio::{net::TcpListener, sync::watch};

use crate::{control::dataplane::Maps, control::state::RunState, control::stats::Snapshot};

/// The OpenMetrics text format, which Prometheus negotiates and parses.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// A client that has not sent its request head by then is disconnected.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One sample's labels, in the order they are printed.
type Labels = Vec<(&'static str, String)>;

/// One metric family: its samples as (labels, value).
#[derive(Debug)]
struct Family {
    /// Without the `_total` suffix for counters (the encoder adds it).
    name: String,
    help: String,
    kind: MetricType,
    samples: Vec<(Labels, Value)>,
}

/// A sample's value: counts, or a gauge with a fraction (a health score).
#[derive(Clone, Copy, Debug)]
enum Value {
    Count(u64),
    Real(f64),
}

/// The families of one scrape, in the order they were added.
#[derive(Debug, Default)]
struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    /// Adds samples to the family `metric` (created on first use). Counter
    /// names are given as exposed, with `_total`; help as a sentence.
    fn add(&mut self, metric: &str, kind: MetricType, help: &str, samples: impl IntoIterator<Item = (Labels, Value)>) {
        let name = match kind {
            MetricType::Counter => metric.strip_suffix("_total").unwrap_or(metric),
            _ => metric,
        };
        let index = match self.families.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                // The registry's format puts no full stop after the help text.
                let help = help.strip_suffix('.').unwrap_or(help).to_owned();
                self.families.push(Family { name: name.to_owned(), help, kind, samples: Vec::new() });
                self.families.len() - 1
            }
        };
        self.families[index].samples.extend(samples);
    }

    fn counter(&mut self, metric: &str, help: &str, samples: impl IntoIterator<Item = (Labels, u64)>) {
        self.add(metric, MetricType::Counter, help, samples.into_iter().map(|(l, v)| (l, Value::Count(v))))
    }

    fn gauge(&mut self, metric: &str, help: &str, samples: impl IntoIterator<Item = (Labels, u64)>) {
        self.add(metric, MetricType::Gauge, help, samples.into_iter().map(|(l, v)| (l, Value::Count(v))))
    }

    fn gauge_real(&mut self, metric: &str, help: &str, samples: impl IntoIterator<Item = (Labels, f64)>) {
        self.add(metric, MetricType::Gauge, help, samples.into_iter().map(|(l, v)| (l, Value::Real(v))))
    }

    fn encode(self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        for family in &self.families {
            let mut metric = encoder.encode_descriptor(&family.name, &family.help, None, family.kind)?;
            match family.samples.as_slice() {
                // A lone unlabelled sample is encoded bare: an empty family
                // label set would print `name{} value`.
                [(labels, value)] if labels.is_empty() => encode_value(family.kind, *value, metric)?,
                samples => {
                    for (labels, value) in samples {
                        encode_value(family.kind, *value, metric.encode_family(labels)?)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn encode_value(kind: MetricType, value: Value, encoder: MetricEncoder) -> std::fmt::Result {
    match (kind, value) {
        (MetricType::Counter, Value::Count(v)) => ConstCounter::new(v).encode(encoder),
        (MetricType::Counter, Value::Real(v)) => ConstCounter::new(v).encode(encoder),
        (_, Value::Count(v)) => ConstGauge::new(v).encode(encoder),
        (_, Value::Real(v)) => ConstGauge::new(v).encode(encoder),
    }
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
        "rocev2_port_pass_total" => "Frames handed to the kernel stack (XDP_PASS), by reason".into(),
        "rocev2_port_drop_total" => "Frames dropped by the dataplane, by reason".into(),
        _ => {
            let mut help = counter.help().to_owned();
            if let Some(first) = help.get(..1) {
                help.replace_range(..1, &first.to_uppercase());
            }
            help
        }
    }
}

fn labels<const N: usize>(pairs: [(&'static str, &str); N]) -> Labels {
    pairs.into_iter().map(|(key, value)| (key, value.to_owned())).collect()
}

/// What the service says about itself beside the counters: the build, the
/// config's reload history, each configured member's state, the process.
#[derive(Clone, Debug, Default)]
pub struct ServiceInfo {
    pub started_at: u64,
    pub reloads: u64,
    pub reload_failures: u64,
    /// Whether the last reload worked (true before any).
    pub last_reload_ok: bool,
    /// When the running config was applied (start or last good reload).
    pub config_loaded_at: u64,
    /// (group, member device, next hop, up) for every configured member.
    pub members: Vec<(String, String, String, bool)>,
    /// From /proc/self: CPU seconds, resident bytes, open file descriptors.
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub open_fds: u64,
}

impl ServiceInfo {
    /// From the state file of a running instance; the process metrics are
    /// those of its `rocev2 run` (its pid), whoever serves them.
    pub fn of(state: &RunState) -> Self {
        let (cpu_seconds, resident_bytes) = usage(state.pid);
        Self {
            started_at: state.started_at,
            reloads: state.reloads,
            reload_failures: state.reload_failures,
            last_reload_ok: !matches!(state.last_reload, crate::control::state::ReloadOutcome::Refused { .. }),
            config_loaded_at: state.config_loaded_at,
            members: state
                .groups
                .iter()
                .flat_map(|g| g.configured.iter().map(|m| (g.name.clone(), m.dev.clone(), m.next_hop.clone(), m.up)))
                .collect(),
            cpu_seconds,
            resident_bytes,
            open_fds: std::fs::read_dir(format!("/proc/{}/fd", state.pid)).map_or(0, |d| d.count() as u64),
        }
    }
}

/// Process `pid`'s CPU time (user + system, seconds) and resident memory
/// (bytes), from /proc/PID/stat.
fn usage(pid: u32) -> (f64, u64) {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return (0.0, 0) };
    // Fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let number = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
    // utime and stime are fields 14 and 15, rss 24 (1-based, counting pid and comm).
    let cpu = (number(11) + number(12)) as f64 / ticks.max(1) as f64;
    (cpu, number(21) * page.max(1) as u64)
}

/// The snapshot in the OpenMetrics text format.
pub fn render_prometheus(snapshot: &Snapshot) -> String {
    render_prometheus_with(snapshot, None)
}

/// The snapshot and, when given, the service's own metrics.
pub fn render_prometheus_with(snapshot: &Snapshot, service: Option<&ServiceInfo>) -> String {
    let mut out = Exposition::default();
    if let Some(info) = service {
        render_service(&mut out, info);
    }
    for &counter in PortCounter::ALL {
        let (metric, reason) = port_metric(counter);
        let help = help_for(&metric, counter);
        out.counter(
            &metric,
            &help,
            snapshot.ports.iter().map(|port| {
                let value = port.counters.get(counter.name()).copied().unwrap_or(0);
                let mut sample = labels([("port", &port.name)]);
                sample.extend(reason.map(|r| ("reason", r.to_owned())));
                (sample, value)
            }),
        );
    }

    let member_labels = |group: &str, m: &crate::control::stats::MemberSnapshot| {
        labels([("group", group), ("member", &m.dev), ("next_hop", &m.next_hop)])
    };
    let members = || snapshot.groups.iter().flat_map(|g| g.members.iter().map(move |m| (g, m)));
    out.counter(
        "rocev2_member_packets_total",
        "Packets forwarded to a group member (the hash distribution).",
        members().map(|(g, m)| (member_labels(&g.name, m), m.packets)),
    );
    out.counter(
        "rocev2_member_bytes_total",
        "Bytes forwarded to a group member.",
        members().map(|(g, m)| (member_labels(&g.name, m), m.bytes)),
    );
    out.counter(
        "rocev2_egress_refused_frames_total",
        "Redirected frames the egress device refused after the XDP program (ring full, device down, veth peer without NAPI): lost, not in forwarded.",
        snapshot.egress_refused.iter().map(|r| (labels([("egress", &r.dev)]), r.frames)),
    );
    // Per member, never per QP: bounded label sets (QP detail is in `rocev2 top`).
    if let Some(qps) = snapshot.telemetry_qps {
        out.gauge("rocev2_telemetry_qps", "QPs in the per-QP telemetry table.", [(Labels::new(), qps)]);
        let transport = || members().filter_map(|(g, m)| m.transport.map(|t| (member_labels(&g.name, m), t)));
        out.counter(
            "rocev2_member_psn_gaps_total",
            "Data PSNs ahead of the expected one on a member's QPs (loss before this switch).",
            transport().map(|(l, t)| (l, t.psn_gaps)),
        );
        out.counter(
            "rocev2_member_retransmits_total",
            "Jumps back in a member's QPs' data PSNs (go-back-N resends, reordering).",
            transport().map(|(l, t)| (l, t.retransmits)),
        );
        out.counter(
            "rocev2_member_naks_total",
            "NAKs answering a member's QPs, by AETH syndrome.",
            transport().flat_map(|(l, t)| {
                let mut sequence = l.clone();
                sequence.push(("syndrome", "sequence_error".to_owned()));
                let mut other = l;
                other.push(("syndrome", "other".to_owned()));
                [(sequence, t.naks_sequence), (other, t.naks_other)]
            }),
        );
        out.counter(
            "rocev2_member_cnps_total",
            "CNPs answering a member's QPs.",
            transport().map(|(l, t)| (l, t.cnps)),
        );
        out.counter(
            "rocev2_member_ce_marked_total",
            "A member's QPs' data packets leaving CE-marked.",
            transport().map(|(l, t)| (l, t.ce_marked)),
        );
        out.counter(
            "rocev2_member_acked_repicks_total",
            "Flowlets of a member's QPs ended by an ACK of everything they had sent (repick = idle-or-acked).",
            transport().map(|(l, t)| (l, t.acked_repicks)),
        );
    }
    let health = || members().filter_map(|(g, m)| m.health.map(|h| (member_labels(&g.name, m), h)));
    out.gauge_real(
        "rocev2_member_health_score",
        "A transport_aware group member's health score: its QPs' weighted, decaying NAKs, retransmissions and CNPs (0 = healthy).",
        health().map(|(l, h)| (l, h.score)),
    );
    out.gauge(
        "rocev2_member_demoted",
        "1 while a transport_aware group member is demoted (new flowlets avoid it), else 0.",
        health().map(|(l, h)| (l, u64::from(h.demoted))),
    );
    out.counter(
        "rocev2_member_demotions_total",
        "Times a transport_aware group member was demoted for its transport health.",
        health().map(|(l, h)| (l, h.demotions)),
    );
    out.counter(
        "rocev2_member_restores_total",
        "Times a demoted transport_aware group member got its buckets back.",
        health().map(|(l, h)| (l, h.restores)),
    );
    out.gauge(
        "rocev2_group_members",
        "Usable members of a next-hop group.",
        snapshot.groups.iter().map(|g| (labels([("group", &g.name), ("hash", &g.hash)]), g.members.len() as u64)),
    );
    out.gauge(
        "rocev2_group_policy",
        "A next-hop group's policy and its knobs, as labels (always 1).",
        snapshot.groups.iter().map(|g| {
            let mut sample = labels([("group", &g.name), ("policy", &g.policy), ("hash", &g.hash)]);
            if let Some(f) = &g.flowlet {
                sample.extend(labels([
                    ("flowlet_gap_us", &f.gap_us.to_string()),
                    ("flowlet_choice", f.choice.name()),
                    ("flowlet_boundary", &f.boundary.to_string()),
                    ("flowlet_table", f.table.name()),
                ]));
            }
            if let Some(t) = &g.transport_aware {
                sample.extend(labels([
                    ("demote_above", &t.demote_above.to_string()),
                    ("restore_below", &t.restore_below.to_string()),
                    ("half_life_ms", &t.half_life_ms.to_string()),
                    ("repick", &t.repick),
                ]));
            }
            (sample, 1)
        }),
    );
    if !snapshot.egress.is_empty() {
        let port = |e: &crate::control::stats::EgressSnapshot| labels([("port", &e.name)]);
        for &c in rocev2_common::counters::EgressCounter::ALL {
            out.counter(
                &format!("rocev2_egress_{}_total", c.name()),
                c.help(),
                snapshot.egress.iter().map(|e| (port(e), e.counters.get(c.name()).copied().unwrap_or(0))),
            );
        }
        out.gauge(
            "rocev2_egress_queue_bytes",
            "Virtual queue depth at the port's last packet.",
            snapshot.egress.iter().map(|e| (port(e), e.queue_bytes)),
        );
        out.gauge(
            "rocev2_egress_queue_high_water_bytes",
            "Deepest the virtual queue has been.",
            snapshot.egress.iter().map(|e| (port(e), e.queue_high_water_bytes)),
        );
    }
    if !snapshot.classes.is_empty() {
        let class = |c: &crate::control::stats::ClassSnapshot| labels([("class", &c.name)]);
        out.counter(
            "rocev2_class_packets_total",
            "Packets matched by a priority class.",
            snapshot.classes.iter().map(|c| (class(c), c.packets)),
        );
        out.counter(
            "rocev2_class_bytes_total",
            "Bytes matched by a priority class.",
            snapshot.classes.iter().map(|c| (class(c), c.bytes)),
        );
    }
    out.gauge("rocev2_flowlet_entries", "Flows in the flowlet table.", [(Labels::new(), snapshot.flowlet_entries)]);
    out.counter(
        "rocev2_flowlet_evictions_total",
        "Flows evicted from the full flowlet table (LRU).",
        [(Labels::new(), snapshot.flowlet_evictions())],
    );
    out.gauge("rocev2_hash_seed", "The hash seed in use.", [(Labels::new(), u64::from(snapshot.seed))]);
    if let Some(l) = &snapshot.learned {
        let table = || labels([("table", &l.table.to_string())]);
        out.gauge(
            "rocev2_learned_routes",
            "Prefixes of the kernel table forwarded in XDP (host entries included).",
            [(table(), l.routes as u64)],
        );
        out.gauge(
            "rocev2_learned_host_entries",
            "Host entries made from the neighbour table on connected subnets.",
            [(table(), l.hosts as u64)],
        );
        out.gauge(
            "rocev2_learned_groups",
            "Groups made for the kernel table's next-hop sets.",
            [(table(), l.groups as u64)],
        );
        out.gauge(
            "rocev2_kernel_routes",
            "Prefixes of the kernel table left to the kernel, by reason.",
            crate::control::routing::fib::KernelReason::ALL.iter().map(|r| {
                let mut sample = table();
                sample.push(("reason", r.name().to_owned()));
                (sample, l.to_kernel.get(r.name()).copied().unwrap_or(0) as u64)
            }),
        );
        out.counter(
            "rocev2_route_messages_total",
            "Netlink messages from the kernel applied.",
            [(table(), l.messages)],
        );
        out.counter(
            "rocev2_route_resyncs_total",
            "Full re-reads of the kernel's tables (start, socket overflow).",
            [(table(), l.resyncs)],
        );
        out.gauge(
            "rocev2_route_apply_microseconds",
            "Kernel change to dataplane updated, over the last 1,000 batches.",
            [("0.5", l.apply_us_p50), ("0.99", l.apply_us_p99)].map(|(quantile, value)| {
                let mut sample = table();
                sample.push(("quantile", quantile.to_owned()));
                (sample, value)
            }),
        );
    }
    if let Some(b) = &snapshot.bridge {
        let bridge = || labels([("bridge", &b.bridge)]);
        out.gauge(
            "rocev2_bridge_ports",
            "Ports of the bridge followed in host bridge mode, and how many of them forward.",
            [("all", b.ports), ("forwarding", b.forwarding)].map(|(state, n)| {
                let mut sample = bridge();
                sample.push(("state", state.to_owned()));
                (sample, n as u64)
            }),
        );
        out.gauge(
            "rocev2_bridge_fdb_entries",
            "Entries of the dataplane's FDB, by where they send a frame.",
            [("port", b.fdb_port), ("uplink", b.fdb_uplink), ("local", b.fdb_local), ("kernel", b.fdb_kernel)].map(
                |(kind, n)| {
                    let mut sample = bridge();
                    sample.push(("kind", kind.to_owned()));
                    (sample, n as u64)
                },
            ),
        );
        out.counter(
            "rocev2_bridge_ageing_refreshes_total",
            "Kernel FDB entries refreshed for hosts whose frames XDP forwarded.",
            [(bridge(), b.ageing_refreshes)],
        );
        out.counter(
            "rocev2_bridge_messages_total",
            "Netlink messages of the bridge applied.",
            [(bridge(), b.messages)],
        );
    }
    out.encode()
}

/// The build, reload, member and process metrics.
fn render_service(out: &mut Exposition, info: &ServiceInfo) {
    out.gauge(
        "rocev2_build_info",
        "The rocev2 build serving these metrics (always 1).",
        [(labels([("version", env!("CARGO_PKG_VERSION")), ("commit", rocev2_version::COMMIT)]), 1)],
    );
    out.counter(
        "rocev2_config_reloads_total",
        "Reloads (SIGHUP, `rocev2 reload`) handled.",
        [(Labels::new(), info.reloads)],
    );
    out.counter(
        "rocev2_config_reload_failures_total",
        "Reloads refused (a mistake in the file or a change that needs a restart); the running config stayed.",
        [(Labels::new(), info.reload_failures)],
    );
    out.gauge(
        "rocev2_config_last_reload_successful",
        "1 if the last reload applied the file (or none was asked for), 0 if it was refused.",
        [(Labels::new(), u64::from(info.last_reload_ok))],
    );
    out.gauge(
        "rocev2_config_last_reload_success_timestamp_seconds",
        "When the running config was applied: the start or the last good reload (Unix time).",
        [(Labels::new(), info.config_loaded_at)],
    );
    out.gauge(
        "rocev2_member_up",
        "1 while a configured group member is in its group (link up, neighbour known), 0 while it is out.",
        info.members.iter().map(|(group, dev, next_hop, up)| {
            (labels([("group", group), ("member", dev), ("next_hop", next_hop)]), u64::from(*up))
        }),
    );
    out.gauge(
        "process_start_time_seconds",
        "Start time of the process (Unix time).",
        [(Labels::new(), info.started_at)],
    );
    out.add(
        "process_cpu_seconds_total",
        MetricType::Counter,
        "User and system CPU time spent.",
        [(Labels::new(), Value::Real(info.cpu_seconds))],
    );
    out.gauge("process_resident_memory_bytes", "Resident memory size.", [(Labels::new(), info.resident_bytes)]);
    out.gauge("process_open_fds", "Open file descriptors.", [(Labels::new(), info.open_fds)]);
}

/// Reads the running instance's state and pinned maps (fresh each scrape,
/// so the endpoint follows member changes and restarts), with the
/// service's own metrics.
pub fn scrape(pin_dir: &Path) -> Result<String> {
    let state = RunState::read(pin_dir)?;
    let maps = Maps::open_pinned(pin_dir)?;
    let mut snapshot = Snapshot::collect(&maps, &state)?;
    snapshot.add_transport(pin_dir, &state)?;
    Ok(render_prometheus_with(&snapshot, Some(&ServiceInfo::of(&state))))
}

/// Status, content type and body for one request.
pub fn respond(
    method: &Method,
    path: &str,
    scrape: impl FnOnce() -> Result<String>,
) -> (StatusCode, &'static str, String) {
    // HEAD is GET without the body (hyper leaves it out): what checks of
    // an endpoint (`curl -I`, load balancers) send.
    if !(method == Method::GET || method == Method::HEAD) || path != "/metrics" {
        return (StatusCode::NOT_FOUND, "text/plain; charset=utf-8", "not found: try GET /metrics\n".into());
    }
    match scrape() {
        Ok(body) => (StatusCode::OK, CONTENT_TYPE, body),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain; charset=utf-8",
            format!("cannot read the dataplane counters: {e:#}\n"),
        ),
    }
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
    let pin_dir = Arc::new(pin_dir);
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
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // E.g. EMFILE: keep serving rather than take `run` down.
                        tracing::warn!("metrics: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let pin_dir = Arc::clone(&pin_dir);
                let service = service_fn(move |request: Request<Incoming>| {
                    let pin_dir = Arc::clone(&pin_dir);
                    async move {
                        // Reading the maps is a few syscalls per entry: off the reactor.
                        let method = request.method().clone();
                        let path = request.uri().path().to_owned();
                        let (status, content_type, body) = tokio::task::spawn_blocking(move || {
                            respond(&method, &path, || scrape(&pin_dir))
                        })
                        .await
                        .unwrap_or_else(|e| {
                            (StatusCode::INTERNAL_SERVER_ERROR, "text/plain; charset=utf-8", format!("scrape failed: {e}\n"))
                        });
                        let mut response = Response::new(Full::new(Bytes::from(body)));
                        *response.status_mut() = status;
                        response.headers_mut().insert(CONTENT_TYPE_HEADER, hyper::header::HeaderValue::from_static(content_type));
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(async move {
                    let connection = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(HEADER_READ_TIMEOUT)
                        .keep_alive(false)
                        .serve_connection(TokioIo::new(stream), service);
                    if let Err(e) = connection.await {
                        tracing::debug!("metrics: connection ended: {e}");
                    }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::control::stats::{GroupSnapshot, MemberSnapshot, PortSnapshot};

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
                flowlet: Some(crate::control::state::FlowletKnobs {
                    gap_us: 500,
                    choice: rocev2_common::flowlet::FlowletChoice::LeastLoaded,
                    boundary: true,
                    table_size: 4096,
                    table: rocev2_common::flowlet::FlowletTable::Keyless,
                }),
                transport_aware: Some(crate::control::state::TransportAwareKnobs {
                    demote_above: 20.0,
                    restore_below: 2.5,
                    half_life_ms: 2000,
                    repick: "idle-or-acked".into(),
                }),
                members: vec![
                    MemberSnapshot {
                        dev: "u1".into(),
                        next_hop: "via 10.0.1.2".into(),
                        packets: 7,
                        bytes: 700,
                        transport: Some(crate::control::stats::MemberTransportView {
                            psn_gaps: 1,
                            retransmits: 2,
                            naks_sequence: 3,
                            naks_other: 4,
                            cnps: 5,
                            ce_marked: 6,
                            acked_repicks: 7,
                        }),
                        health: Some(crate::control::health::MemberHealth {
                            score: 12.5,
                            demoted: true,
                            demotions: 2,
                            restores: 1,
                        }),
                    },
                    MemberSnapshot {
                        dev: "u2".into(),
                        next_hop: "mac 02:00:00:00:00:02".into(),
                        packets: 9,
                        bytes: 900,
                        transport: Some(Default::default()),
                        health: None,
                    },
                ],
            }],
            egress: vec![crate::control::stats::EgressSnapshot {
                name: "u1".into(),
                rate_bytes_per_sec: 1_250_000_000,
                counters: rocev2_common::counters::EgressCounter::ALL.iter().map(|c| (c.name(), 5)).collect(),
                queue_bytes: 1500,
                queue_high_water_bytes: 90_000,
            }],
            classes: vec![crate::control::stats::ClassSnapshot { name: "control".into(), packets: 3, bytes: 180 }],
            flowlet_entries: 4,
            seed: 0,
            seed_auto: false,
            learned: Some(crate::control::state::LearnedStats {
                table: 254,
                routes: 7,
                to_kernel: [("reject".to_string(), 2)].into_iter().collect(),
                ..Default::default()
            }),
            bridge: Some(crate::control::bridge::BridgeStats {
                bridge: "br0".into(),
                ports: 5,
                forwarding: 4,
                fdb_port: 2,
                fdb_uplink: 1,
                ageing_refreshes: 9,
                ..Default::default()
            }),
            telemetry_qps: Some(12),
            egress_refused: vec![crate::control::stats::RefusedSnapshot { dev: "u1".into(), ifindex: 4, frames: 3 }],
            egress_refused_uncounted: None,
            unmanaged: None,
        }
    }

    fn service() -> ServiceInfo {
        ServiceInfo {
            started_at: 1_700_000_000,
            reloads: 3,
            reload_failures: 1,
            last_reload_ok: false,
            config_loaded_at: 1_700_000_100,
            members: vec![
                ("spines".into(), "u1".into(), "via 10.0.1.2".into(), true),
                ("spines".into(), "u3".into(), "via 10.0.3.2".into(), false),
            ],
            cpu_seconds: 1.5,
            resident_bytes: 4096,
            open_fds: 9,
        }
    }

    /// The sample names of an exposition (`rocev2_port_rx_packets_total`,
    /// not the family name without `_total`).
    fn sample_names(text: &str) -> std::collections::BTreeSet<String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.split(['{', ' ']).next().unwrap_or("").to_string())
            .collect()
    }

    #[test]
    fn build_reload_member_and_process_metrics() {
        let text = render_prometheus_with(&snapshot(), Some(&service()));
        let commit = rocev2_version::COMMIT;
        let version = env!("CARGO_PKG_VERSION");
        for line in [
            format!("rocev2_build_info{{version=\"{version}\",commit=\"{commit}\"}} 1"),
            "rocev2_config_reloads_total 3".to_string(),
            "rocev2_config_reload_failures_total 1".to_string(),
            "rocev2_config_last_reload_successful 0".to_string(),
            "rocev2_config_last_reload_success_timestamp_seconds 1700000100".to_string(),
            "rocev2_member_up{group=\"spines\",member=\"u1\",next_hop=\"via 10.0.1.2\"} 1".to_string(),
            "rocev2_member_up{group=\"spines\",member=\"u3\",next_hop=\"via 10.0.3.2\"} 0".to_string(),
            "process_start_time_seconds 1700000000".to_string(),
            "process_cpu_seconds_total 1.5".to_string(),
            "process_open_fds 9".to_string(),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        assert_eq!(text.matches("# EOF").count(), 1, "one exposition: {text}");
        // This process's own usage reads as something.
        let (cpu, rss) = usage(std::process::id());
        assert!(cpu >= 0.0 && rss > 0, "{cpu} {rss}");
    }

    /// The Grafana dashboard shipped in packaging/ queries only metrics the
    /// daemon exports (a renamed metric fails here, not on a dashboard).
    #[test]
    fn the_grafana_dashboard_uses_only_exported_metrics() {
        let exported = sample_names(&render_prometheus_with(&snapshot(), Some(&service())));
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/grafana-dashboard.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let dashboard: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(map) => {
                    for (key, value) in map {
                        match (key.as_str(), value) {
                            ("expr" | "query", serde_json::Value::String(e)) => out.push(e.clone()),
                            _ => exprs(value, out),
                        }
                    }
                }
                serde_json::Value::Array(list) => list.iter().for_each(|x| exprs(x, out)),
                _ => {}
            }
        }
        let mut found = Vec::new();
        exprs(&dashboard, &mut found);
        assert!(found.len() >= 8, "a dashboard with panels: {found:?}");
        let mut used = std::collections::BTreeSet::new();
        for expr in &found {
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')) {
                if word.starts_with("rocev2_") || word.starts_with("process_") {
                    used.insert(word.to_string());
                }
            }
        }
        let unknown: Vec<&String> = used.iter().filter(|m| !exported.contains(*m)).collect();
        assert!(
            unknown.is_empty(),
            "the dashboard queries metrics the daemon does not export: {unknown:?}\nexported: {exported:?}"
        );
        assert!(used.len() >= 10, "{used:?}");
    }

    #[test]
    fn bridge_metrics() {
        let text = render_prometheus(&snapshot());
        assert!(text.contains("rocev2_bridge_ports{bridge=\"br0\",state=\"forwarding\"} 4"), "{text}");
        assert!(text.contains("rocev2_bridge_fdb_entries{bridge=\"br0\",kind=\"uplink\"} 1"), "{text}");
        assert!(text.contains("rocev2_bridge_ageing_refreshes_total{bridge=\"br0\"} 9"), "{text}");
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
    fn per_member_transport_metrics_have_no_qp_label() {
        let text = render_prometheus(&snapshot());
        let u1 = "group=\"spines\",member=\"u1\",next_hop=\"via 10.0.1.2\"";
        for line in [
            "rocev2_telemetry_qps 12".to_string(),
            "rocev2_egress_refused_frames_total{egress=\"u1\"} 3".to_string(),
            format!("rocev2_member_psn_gaps_total{{{u1}}} 1"),
            format!("rocev2_member_retransmits_total{{{u1}}} 2"),
            format!("rocev2_member_naks_total{{{u1},syndrome=\"sequence_error\"}} 3"),
            format!("rocev2_member_naks_total{{{u1},syndrome=\"other\"}} 4"),
            format!("rocev2_member_cnps_total{{{u1}}} 5"),
            format!("rocev2_member_ce_marked_total{{{u1}}} 6"),
            format!("rocev2_member_acked_repicks_total{{{u1}}} 7"),
            format!("rocev2_member_health_score{{{u1}}} 12.5"),
            format!("rocev2_member_demoted{{{u1}}} 1"),
            format!("rocev2_member_demotions_total{{{u1}}} 2"),
            format!("rocev2_member_restores_total{{{u1}}} 1"),
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }
        assert!(!text.contains("qp="), "{text}");
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
                "rocev2_group_policy{group=\"spines\",policy=\"flowlet\",hash=\"qp\",flowlet_gap_us=\"500\",flowlet_choice=\"least-loaded\",flowlet_boundary=\"true\",flowlet_table=\"keyless\",demote_above=\"20\",restore_below=\"2.5\",half_life_ms=\"2000\",repick=\"idle-or-acked\"} 1\n"
            ),
            "{text}"
        );

        // Every family has exactly one HELP and one TYPE line, before its
        // samples; every sample line is `name{labels} integer`, a counter's
        // name being its family's with `_total`; the text ends with `# EOF`.
        assert!(text.ends_with("# EOF\n"), "{text}");
        let mut seen_type = std::collections::BTreeMap::new();
        let mut samples = 0;
        for line in text.lines().filter(|l| *l != "# EOF") {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                assert!(seen_type.insert(name.to_owned(), kind.to_owned()).is_none(), "two TYPE lines for {name}");
                assert!(kind == "counter" || kind == "gauge", "{line}");
            } else if line.starts_with("# HELP ") {
            } else {
                let name = &line[..line.find(['{', ' ']).unwrap()];
                let family = name.strip_suffix("_total").filter(|f| seen_type.get(*f).is_some_and(|k| k == "counter"));
                let family = family.unwrap_or(name);
                assert!(seen_type.contains_key(family), "sample before its TYPE: {line}");
                let value = line.rsplit(' ').next().unwrap();
                value.parse::<f64>().unwrap_or_else(|_| panic!("{line}"));
                samples += 1;
            }
        }
        let help = text.lines().filter(|l| l.starts_with("# HELP")).count();
        assert_eq!(help, seen_type.len());
        // Ports, members (packets and bytes), group gauges (members and
        // policy), one egress port's counters and two queue gauges, a
        // class (packets and bytes), the two flowlet-table samples, the
        // seed, and the learned-route gauges and counters (routes, hosts,
        // groups, one per kernel reason, messages, resyncs, two quantiles),
        // and telemetry: QPs tracked, six transport samples per member
        // (gaps, retransmits, two NAK syndromes, CNPs, CE, acked re-picks), and the health
        // of the one member that has it (score, demoted, demotions, restores);
        // one egress device's refused frames; the bridge: two port gauges,
        // four FDB kinds, two counters.
        let egress = rocev2_common::counters::EgressCounter::ALL.len() + 2;
        let learned = 3 + crate::control::routing::fib::KernelReason::ALL.len() + 2 + 2;
        let telemetry = 1 + 2 * 7 + 4;
        let bridge = 2 + 4 + 2;
        assert_eq!(
            samples,
            2 * PortCounter::ALL.len() + 2 + 2 + 2 + egress + 2 + 2 + 1 + learned + telemetry + 1 + bridge
        );
    }

    #[test]
    fn only_get_metrics_is_served() {
        let ok = || Ok("x 1\n".to_string());
        assert_eq!(respond(&Method::GET, "/metrics", ok).0, StatusCode::OK);
        assert_eq!(respond(&Method::GET, "/metrics", ok).1, CONTENT_TYPE);
        assert_eq!(respond(&Method::GET, "/", ok).0, StatusCode::NOT_FOUND);
        assert_eq!(respond(&Method::POST, "/metrics", ok).0, StatusCode::NOT_FOUND);
        assert_eq!(respond(&Method::HEAD, "/metrics", ok).0, StatusCode::OK);
        let failed = respond(&Method::GET, "/metrics", || anyhow::bail!("no state"));
        assert!(failed.0 == StatusCode::SERVICE_UNAVAILABLE && failed.2.contains("no state"));
    }
}
