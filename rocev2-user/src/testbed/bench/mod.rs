//! `rocev2 bench` (run by `cargo xtask bench`): one table of what the
//! dataplane costs on this machine, written to BENCHMARKS.md.
//!
//! 1. Per-packet cost in BPF_PROG_TEST_RUN: the trivial redirect program
//!    (the floor) and each pipeline, IPv4 and IPv6, with 10 and 100,000
//!    routes.
//! 2. End-to-end forwarding rate through a switch namespace between veths:
//!    kernel forwarding (multipath route), the trivial redirect program
//!    (the limit) and each pipeline, all fed by the same generator.
//!    Host bridge mode's rows: the bridge program per packet, and bridging
//!    through veths against the kernel bridge (`bench/bridge.rs`).
//! 3. Control plane: loading 100,000 routes, a group change taking effect,
//!    memory of the maps.

mod bridge;
mod budget;
mod collective_model;
mod forwarding;
mod jit_lines;
mod kernel_routes;
mod lab_build;
mod placement;
mod profile;
mod telemetry;

use forwarding::{part2, FwdRow, UPLINKS};
use rocev2_common::rng::splitmix64;
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use aya::{
    programs::{xdp::XdpLinkId, Xdp, XdpMode},
    TestRun as _, TestRunOptions,
};
use rocev2_common::{
    bth::{opcode, Bth},
    class::{add_opcode, ClassEntry, CLASS_ECN_EXEMPT, CLASS_MATCH_OPCODE, CLASS_MATCH_PAYLOAD, CLASS_SET_DSCP},
    ecn::{EcnProfile, ECT0},
    features::Features,
    flowlet::{FlowletChoice, FlowletTable},
    hash::{HashMode, HashVersion},
    maps::{route_cache_slot, DEFAULT_FLOWLET_SLOTS, DEFAULT_FLOWLET_TABLE_SIZE},
};

use crate::{
    control::config::{FlowletConfig, Policy, Prefix},
    control::dataplane::{Dataplane, GroupPolicy, MemberSpec, XDP_PROGRAM},
    sys::netns::{self, unique_name, Netns},
    tools::gen::{self, GenArgs, GenMode, SportModel},
    tools::packet::{build_roce_frame, RoceFrameSpec},
    tools::programs::{ToolPrograms, XDP_DROP_PROGRAM, XDP_FIB_PROGRAM, XDP_REDIRECT_PROGRAM},
};

const XDP_REDIRECT: u32 = 4;
const LOOPBACK: u32 = 1;
const GROUP: u32 = 0;
/// One program run per BPF_PROG_TEST_RUN call. A call with repeat > 1
/// runs on one buffer whose TTL the forwarding program decrements (so at
/// most 254 useful repeats), and first swaps the program into the XDP
/// dispatcher (text_poke, two synchronize_rcu): the first runs after that
/// are cache-cold, which at repeat 250 added 100-150 ns to every packet
/// and at repeat 10 about 700 ns. With repeat 1 each call gets a fresh
/// copy of the frame and the program stays warm between calls.
const TEST_REPEAT: u32 = 1;
const BIG_ROUTES: usize = 100_000;
/// Part-1 sample key of the route-cache-miss row (after the variants).
const CACHE_MISS_ROW: usize = VARIANTS.len() + 1;

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Where to write the report.
    #[arg(long, default_value = "BENCHMARKS.md")]
    pub out: PathBuf,
    /// Program runs per part-1 measurement (one BPF_PROG_TEST_RUN call each).
    #[arg(long, default_value_t = 200_000)]
    pub packets: u64,
    /// Rounds per measurement (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Seconds of traffic per forwarding measurement.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Rounds per forwarding measurement.
    #[arg(long, default_value_t = 3)]
    pub fwd_rounds: usize,
    /// Instead of the report: where one pipeline's per-packet time goes,
    /// source line by source line (five-tuple, qp, flowlet or full; or
    /// `floor`, or a primitive's program such as `rocev2_prim_array`), from
    /// `perf record` samples of its part-1 measurement. The report has the
    /// qp and full pipelines' profiles too.
    #[arg(long, value_name = "PIPELINE")]
    pub profile: Option<String>,
    /// Seconds each profile samples (the report's budgets profile every
    /// budget row's program and the one it is read against; 0: none, and
    /// the budgets leave their remainders unplaced).
    #[arg(long, default_value_t = 4.0)]
    pub profile_seconds: f64,
    /// Profile the IPv6 frame instead of the IPv4 one.
    #[arg(long)]
    pub profile_v6: bool,
    /// Lines --profile shows before it sums up the rest.
    #[arg(long, default_value_t = profile::REPORT_ROWS)]
    pub profile_rows: usize,
    /// Instead of the report: run one part-1 measurement in a loop for
    /// this many seconds, printing its cost, so `perf record -a` can
    /// profile it (five-tuple, qp, flowlet or full; IPv4 unless --loop-v6).
    #[arg(long, value_name = "PIPELINE")]
    pub r#loop: Option<String>,
    /// Seconds --loop runs.
    #[arg(long, default_value_t = 10.0)]
    pub loop_seconds: f64,
    /// Loop over the IPv6 frame instead of the IPv4 one.
    #[arg(long)]
    pub loop_v6: bool,
    /// Repetitions per test-run call in --loop (at most 254, see TEST_REPEAT;
    /// shows the cold-start cost of repeat > 1).
    #[arg(long, default_value_t = TEST_REPEAT)]
    pub loop_repeat: u32,
    /// Instead of the report: print host bridge mode's rows alone (fed by
    /// XDP live frames, without the routed rows' goal).
    #[arg(long)]
    pub bridge_only: bool,
    /// Instead of the report: print part 1 alone (per-packet cost by
    /// BPF_PROG_TEST_RUN, rows interleaved in every round), for an A/B of
    /// one change in a few minutes, e.g. the hash_version rows.
    #[arg(long)]
    pub per_packet_only: bool,
    /// Instead of the report: print the telemetry rows alone (telemetry
    /// off and on, interleaved in every round), for an A/B of a telemetry
    /// change.
    #[arg(long)]
    pub telemetry_only: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pipeline {
    FiveTuple,
    Qp,
    Flowlet,
    Full,
}

const PIPELINES: [Pipeline; 4] = [Pipeline::FiveTuple, Pipeline::Qp, Pipeline::Flowlet, Pipeline::Full];

impl Pipeline {
    fn short_name(self) -> &'static str {
        match self {
            Pipeline::FiveTuple => "five-tuple",
            Pipeline::Qp => "qp",
            Pipeline::Flowlet => "flowlet",
            Pipeline::Full => "full",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Pipeline::FiveTuple => "rocev2 five-tuple",
            Pipeline::Qp => "rocev2 qp",
            Pipeline::Flowlet => "rocev2 flowlet",
            Pipeline::Full => "rocev2 flowlet+ECN+classes",
        }
    }

    /// A test-run dataplane loaded with this pipeline's features and
    /// configured for it on lo (what --profile and --loop measure).
    fn test_run_dataplane(self) -> Result<Dataplane> {
        let mut dp = test_run_dataplane_with(DEFAULT_FLOWLET_TABLE_SIZE, self.features())?;
        self.configure(&mut dp, &lo_members(0xBB), &[LOOPBACK])?;
        Ok(dp)
    }

    /// Publishes the group with this pipeline's policy (and, for Full, an
    /// ECN profile, a virtual queue on `egress` and classes), hashing with
    /// the version new configs use.
    fn configure(self, dp: &mut Dataplane, members: &[MemberSpec], egress: &[u32]) -> Result<()> {
        dp.maps.set_hash(0, HashVersion::V2)?;
        let flowlet = flowlet_policy(FlowletTable::Keyed);
        let policy = match self {
            Pipeline::FiveTuple => GroupPolicy::hash(HashMode::FiveTuple),
            Pipeline::Qp => GroupPolicy::hash(HashMode::Qp),
            Pipeline::Flowlet | Pipeline::Full => flowlet,
        };
        dp.maps.publish_group_with(GROUP, &policy, members)?;
        if self == Pipeline::Full {
            add_ecn_queue(dp, egress)?;
            add_classes(dp)?;
        }
        Ok(())
    }

    /// The features `rocev2 run` loads for a config of this pipeline.
    fn features(self) -> Features {
        match self {
            Pipeline::FiveTuple | Pipeline::Qp => Features::COUNTERS,
            Pipeline::Flowlet => Features::COUNTERS.with(Features::FLOWLET_KEYED),
            Pipeline::Full => {
                Features::COUNTERS.with(Features::FLOWLET_KEYED).with(Features::ECN).with(Features::CLASSES)
            }
        }
    }

    /// Issue target in ns above the floor.
    fn target_ns(self) -> f64 {
        match self {
            Pipeline::FiveTuple => 45.0,
            Pipeline::Qp => 40.0,
            Pipeline::Flowlet => 80.0,
            Pipeline::Full => 100.0,
        }
    }
}

/// The benchmark's flowlet group: `qp` hashing, a 50 us gap, re-hashed
/// new flowlets that start only at a message end.
fn flowlet_policy(table: FlowletTable) -> GroupPolicy {
    let flowlet = FlowletConfig {
        gap: Duration::from_micros(50),
        choice: FlowletChoice::Rehash,
        at_message_boundary: true,
        table_size: DEFAULT_FLOWLET_SLOTS,
        table,
    };
    GroupPolicy::new(HashMode::Qp, &Policy::Flowlet(flowlet), None)
}

/// A virtual queue (SONiC's lossless ECN profile, a 25 Gbit/s port) on
/// each of `egress`.
fn add_ecn_queue(dp: &mut Dataplane, egress: &[u32]) -> Result<()> {
    let pmax = (0.05 * u32::MAX as f64) as u32;
    dp.maps.set_ecn_profile(0, EcnProfile { kmin_bytes: 1 << 20, kmax_bytes: 2 << 20, pmax_scaled: pmax, flags: 0 })?;
    for (slot, ifindex) in egress.iter().enumerate() {
        dp.maps.set_egress(*ifindex, slot as u32, 25_000_000_000 / 8, 0)?;
    }
    Ok(())
}

/// Two classes: control (ACK, CNP) and small WRITE-with-immediate.
fn add_classes(dp: &mut Dataplane) -> Result<()> {
    let mut control = ClassEntry {
        flags: CLASS_MATCH_OPCODE | CLASS_SET_DSCP | CLASS_ECN_EXEMPT,
        set_dscp: 48,
        ..Default::default()
    };
    add_opcode(&mut control.opcodes, opcode::ACK);
    add_opcode(&mut control.opcodes, opcode::CNP);
    let mut cts = ClassEntry {
        flags: CLASS_MATCH_OPCODE | CLASS_MATCH_PAYLOAD | CLASS_SET_DSCP,
        set_dscp: 46,
        max_payload: 64,
        ..Default::default()
    };
    add_opcode(&mut cts.opcodes, opcode::WRITE_ONLY_IMM);
    Ok(dp.maps.set_classes(&[control, cts])?)
}

/// A part-1 row measured on its own dataplane instance: the pipelines with
/// the features `rocev2 run` would load for them, and the marginal rows
/// (qp plus one feature, or minus the counters) read against qp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Pipeline(Pipeline),
    /// The flowlet pipeline with a keyless table (4096 slots) instead of the keyed LRU.
    FlowletKeyless,
    QpNoCounters,
    QpClasses,
    QpEcn,
    QpAllFeaturesLoaded,
    /// The qp pipeline with `hash_version = 1`: the A/B of the hash.
    QpHashV1,
}

const VARIANTS: [Variant; 10] = [
    Variant::Pipeline(Pipeline::FiveTuple),
    Variant::Pipeline(Pipeline::Qp),
    Variant::Pipeline(Pipeline::Flowlet),
    Variant::FlowletKeyless,
    Variant::Pipeline(Pipeline::Full),
    Variant::QpNoCounters,
    Variant::QpClasses,
    Variant::QpEcn,
    Variant::QpAllFeaturesLoaded,
    Variant::QpHashV1,
];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Pipeline(p) => p.name(),
            Variant::FlowletKeyless => "rocev2 flowlet, keyless table",
            Variant::QpNoCounters => "rocev2 qp without counters (marginal: counters)",
            Variant::QpClasses => "rocev2 qp + 2 classes (marginal: classes)",
            Variant::QpEcn => "rocev2 qp + ECN virtual queue (marginal: ECN)",
            Variant::QpAllFeaturesLoaded => "rocev2 qp, every feature loaded but unused (marginal: no gating)",
            Variant::QpHashV1 => "rocev2 qp, hash_version = 1 (marginal: the hash, v1 against v2)",
        }
    }

    fn features(self) -> Features {
        match self {
            Variant::Pipeline(p) => p.features(),
            Variant::FlowletKeyless => Features::COUNTERS.with(Features::FLOWLET_KEYLESS),
            Variant::QpNoCounters => Features::NONE,
            Variant::QpClasses => Features::COUNTERS.with(Features::CLASSES),
            Variant::QpEcn => Features::COUNTERS.with(Features::ECN),
            // Telemetry records every packet once loaded (it has its own rows).
            Variant::QpAllFeaturesLoaded => Features::ALL.without(Features::TELEMETRY),
            Variant::QpHashV1 => Pipeline::Qp.features(),
        }
    }

    fn configure(self, dp: &mut Dataplane) -> Result<()> {
        let pipeline = match self {
            Variant::Pipeline(p) => p,
            Variant::FlowletKeyless => Pipeline::Flowlet,
            _ => Pipeline::Qp,
        };
        pipeline.configure(dp, &lo_members(0xBB), &[LOOPBACK])?;
        match self {
            Variant::FlowletKeyless => {
                // The flowlet pipeline's group again, its state in the keyless slots.
                let policy = flowlet_policy(FlowletTable::Keyless);
                dp.maps.publish_group_with(GROUP, &policy, &lo_members(0xBB))?;
                Ok(())
            }
            Variant::QpClasses => add_classes(dp),
            Variant::QpEcn => add_ecn_queue(dp, &[LOOPBACK]),
            Variant::QpHashV1 => Ok(dp.maps.set_hash(0, HashVersion::V1)?),
            _ => Ok(()),
        }
    }

    /// Marginal rows are measured with 10 routes only.
    fn marginal(self) -> bool {
        !matches!(self, Variant::Pipeline(_) | Variant::FlowletKeyless)
    }
}

/// One row of the report.
struct Row {
    part: &'static str,
    what: String,
    setup: String,
    result: String,
    relative: String,
    target: String,
}

/// The goals of the per-packet rows that are not a pipeline's own (ns
/// above what they are read against): a marginal cost that operators
/// will leave on must stay small against the forwarding decision.
const ECN_GOAL_NS: f64 = 20.0;
const UNUSED_FEATURES_GOAL_NS: f64 = 5.0;
const TELEMETRY_GOAL_NS: f64 = 25.0;

/// The target cell of a row whose cost `ns` should be at most `goal` ns.
fn at_most_ns(ns: f64, goal: f64) -> String {
    format!("<= +{goal:.0} ns: {}", if ns <= goal { "met" } else { "MISSED" })
}

fn row(
    part: &'static str,
    what: impl Into<String>,
    setup: impl Into<String>,
    result: impl Into<String>,
    relative: impl Into<String>,
    target: impl Into<String>,
) -> Row {
    Row {
        part,
        what: what.into(),
        setup: setup.into(),
        result: result.into(),
        relative: relative.into(),
        target: target.into(),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// A dataplane as `rocev2 run` loads it for `features`, its forwarding
/// program verified now (not inside a measurement).
fn load_dataplane_with(flowlet_table: u32, features: Features) -> Result<Dataplane> {
    let mut dp = Dataplane::load_with_features(None, flowlet_table, features)?;
    dp.preload(&[XDP_PROGRAM])?;
    Ok(dp)
}

/// Where the bench finds a program by name: a dataplane (the pipeline) or
/// the tools object (the floor, the FIB peer, the receivers).
pub(super) trait Programs: Send {
    fn program(&mut self, name: &str) -> Result<&mut Xdp>;
}

impl Programs for Dataplane {
    fn program(&mut self, name: &str) -> Result<&mut Xdp> {
        self.xdp_program(name)
    }
}

impl Programs for ToolPrograms {
    fn program(&mut self, name: &str) -> Result<&mut Xdp> {
        self.xdp(name)
    }
}

/// The floor for BPF_PROG_TEST_RUN rows: redirects to lo.
fn test_run_floor() -> Result<ToolPrograms> {
    let mut floor = ToolPrograms::load()?;
    floor.set_floor_target(LOOPBACK)?;
    floor.xdp(XDP_REDIRECT_PROGRAM)?;
    Ok(floor)
}

/// Map ids a program uses.
fn map_ids(programs: &mut impl Programs, program: &str) -> Result<Vec<u32>> {
    let info = programs.program(program)?.info().context("BPF_OBJ_GET_INFO_BY_FD")?;
    Ok(info.map_ids().context("map ids")?.unwrap_or_default())
}

fn bench_dst(v6: bool) -> IpAddr {
    if v6 {
        "fd01::1".parse::<Ipv6Addr>().unwrap().into()
    } else {
        Ipv4Addr::new(10, 1, 0, 1).into()
    }
}

/// The route cache's words for an address (as the XDP program makes them).
fn cache_words(a: IpAddr) -> [u32; 4] {
    match a {
        IpAddr::V4(a) => rocev2_common::hash::ipv4_words(a.octets()),
        IpAddr::V6(a) => rocev2_common::hash::ipv6_words(&a.octets()),
    }
}

/// Another routed destination (in 10.1.0.0/16 or fd01::/64) that shares
/// bench_dst's route-cache slot: alternating the two misses every time.
fn cache_twin(v6: bool) -> IpAddr {
    let slot = route_cache_slot(&cache_words(bench_dst(v6)));
    (2..=u16::MAX)
        .map(|i| -> IpAddr {
            if v6 {
                Ipv6Addr::new(0xfd01, 0, 0, 0, 0, 0, 0, i).into()
            } else {
                Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8).into()
            }
        })
        .find(|a| route_cache_slot(&cache_words(*a)) == slot)
        .expect("some address shares the slot")
}

fn bench_frame(v6: bool, ttl: u8, dst_mac: [u8; 6]) -> Vec<u8> {
    bench_frame_to(bench_dst(v6), ttl, dst_mac)
}

fn bench_frame_to(dst: IpAddr, ttl: u8, dst_mac: [u8; 6]) -> Vec<u8> {
    let src: IpAddr =
        if dst.is_ipv6() { "fd00::1".parse::<Ipv6Addr>().unwrap().into() } else { Ipv4Addr::new(10, 0, 0, 1).into() };
    build_roce_frame(&RoceFrameSpec {
        src_mac: [2, 0, 0, 0, 0, 1],
        dst_mac,
        vlan: None,
        src_ip: src,
        dst_ip: dst,
        ttl,
        dscp: 26,
        ecn: ECT0,
        src_port: 0xC000,
        bth: Bth {
            opcode: opcode::WRITE_ONLY,
            solicited: false,
            pad_count: 0,
            pkey: 0xFFFF,
            fecn: false,
            becn: false,
            dest_qp: 0x100,
            ack_req: true,
            psn: 1,
        },
        payload_len: 1024,
    })
}

/// Mean ns per packet over PACKETS runs of `program` on `frame`.
fn cost_ns(dp: &mut impl Programs, program: &str, frame: &[u8], packets: u64) -> Result<f64> {
    cost_ns_repeat(dp, program, frame, packets, TEST_REPEAT)
}

fn cost_ns_repeat(dp: &mut impl Programs, program: &str, frame: &[u8], packets: u64, repeat: u32) -> Result<f64> {
    cost_ns_frames(dp, program, &[frame], packets, repeat)
}

/// Like cost_ns_repeat, taking the frames in turn, one per call.
fn cost_ns_frames(dp: &mut impl Programs, program: &str, frames: &[&[u8]], packets: u64, repeat: u32) -> Result<f64> {
    let prog = dp.program(program)?;
    let calls = (packets / u64::from(repeat)).max(1);
    let mut total_ns = 0u128;
    for call in 0..calls {
        let frame = frames[call as usize % frames.len()];
        let r = prog
            .test_run(TestRunOptions { data_in: Some(frame), repeat, ..Default::default() })
            .context("BPF_PROG_TEST_RUN")?;
        if r.return_value != XDP_REDIRECT {
            bail!("{program} returned {} instead of XDP_REDIRECT", r.return_value);
        }
        // The kernel reports the mean per repetition, rounded down to a
        // whole ns (a bias below 1 ns that the floor shares).
        total_ns += r.duration.as_nanos() * u128::from(repeat);
    }
    Ok(total_ns as f64 / (calls * u64::from(repeat)) as f64)
}

/// `n` distinct random /24s (v4) or /64s (v6), seeded, none covering the
/// benchmark destinations.
fn random_routes(n: usize, v6: bool, seed: u64) -> Vec<Prefix> {
    let mut rng = seed;
    let mut seen = BTreeSet::new();
    while seen.len() < n {
        let r = splitmix64(&mut rng);
        let p = if v6 {
            let hi = (0x2000_0000_0000_0000u64 | (r >> 4)) as u128;
            Prefix::V6 { addr: Ipv6Addr::from(hi << 64), len: 64 }
        } else {
            let a = (r as u32) & 0xFFFF_FF00;
            if a >> 16 == 0x0A01 {
                continue;
            }
            Prefix::V4 { addr: Ipv4Addr::from(a), len: 24 }
        };
        seen.insert(p);
    }
    seen.into_iter().collect()
}

fn base_routes() -> BTreeMap<Prefix, u32> {
    let mut wanted = BTreeMap::new();
    wanted.insert(Prefix::V4 { addr: Ipv4Addr::new(10, 1, 0, 0), len: 16 }, GROUP);
    wanted.insert(Prefix::V6 { addr: "fd01::".parse().unwrap(), len: 64 }, GROUP);
    // 10 routes in all: 4 more of each family.
    for p in random_routes(4, false, 7).into_iter().chain(random_routes(4, true, 7)) {
        wanted.insert(p, GROUP);
    }
    wanted
}

fn lo_members(tag: u8) -> Vec<MemberSpec> {
    (0..4u8)
        .map(|i| MemberSpec { ifindex: LOOPBACK, src_mac: [2, 0xAA, 0, 0, 0, i], dst_mac: [2, tag, 0, 0, 0, i] })
        .collect()
}

/// A dataplane forwarding 10.1.0.0/16 and fd01::/64 over four members on
/// lo (what BPF_PROG_TEST_RUN can redirect to).
fn test_run_dataplane(flowlet_table: u32) -> Result<Dataplane> {
    test_run_dataplane_with(flowlet_table, Features::ALL)
}

fn test_run_dataplane_with(flowlet_table: u32, features: Features) -> Result<Dataplane> {
    let mut dp = load_dataplane_with(flowlet_table, features)?;
    dp.maps.set_port(LOOPBACK, 1)?;
    dp.maps.add_egress_dev(LOOPBACK)?;
    dp.maps.publish_group(GROUP, HashMode::Qp, &lo_members(0xBB))?;
    dp.sync_routes(&base_routes())?;
    Ok(dp)
}

struct Instructions {
    program: &'static str,
    xlated: u32,
    jited_bytes: u32,
    verified: u32,
}

fn instructions_line(i: &Instructions, row: &str) -> String {
    format!(
        "- `{}` as loaded for {row}: {} xlated BPF instructions, {} bytes JITed, {} instructions processed by the verifier",
        i.program, i.xlated, i.jited_bytes, i.verified
    )
}

fn instructions(dp: &mut impl Programs, program: &'static str) -> Result<Instructions> {
    let info = dp.program(program)?.info()?;
    Ok(Instructions {
        program,
        xlated: info.size_translated().unwrap_or(0) / 8,
        jited_bytes: info.size_jitted(),
        verified: info.verified_instruction_count().unwrap_or(0),
    })
}

/// memlock of every map `ids` names, from /proc/self/fdinfo (one fd per map).
fn maps_memlock(ids: &BTreeSet<u32>) -> Result<(u64, Vec<(String, u64)>)> {
    let mut seen = BTreeMap::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Ok(target) = std::fs::read_link(entry.path()) else { continue };
        if target.to_string_lossy() != "anon_inode:bpf-map" {
            continue;
        }
        let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", entry.file_name().to_string_lossy()))
        else {
            continue;
        };
        let field =
            |name: &str| info.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().parse::<u64>().unwrap_or(0));
        let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:")) else { continue };
        if ids.contains(&(id as u32)) {
            seen.insert(id as u32, memlock);
        }
    }
    let mut per_map = Vec::new();
    for (id, memlock) in &seen {
        // The table's name: the kernel keeps only 15 characters.
        let name = aya::maps::MapInfo::from_id(*id)
            .ok()
            .and_then(|i| i.name_as_str().map(|n| rocev2_common::maps::spec_of(n).map_or(n, |m| m.name).to_owned()))
            .unwrap_or_else(|| format!("map {id}"));
        per_map.push((name, *memlock));
    }
    per_map.sort_by_key(|m| std::cmp::Reverse(m.1));
    Ok((seen.values().sum(), per_map))
}

fn dataplane_memlock(dp: &mut Dataplane) -> Result<(u64, Vec<(String, u64)>)> {
    let ids = map_ids(dp, XDP_PROGRAM)?.into_iter().collect();
    maps_memlock(&ids)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

// ------------------------------------------------------------ part 1 + 3

struct Part1 {
    rows: Vec<Row>,
    /// The full pipeline's worst ns above the floor, over both families
    /// and both route-table sizes.
    worst_full: f64,
    /// Each primitive's measured ns per operation (10 routes' rounds).
    floors: budget::Floors,
    /// IPv4, 10 routes: each budget row's cost (ns above what it is read
    /// against), in BUDGET_ROWS order, telemetry's added by the caller.
    costs: BTreeMap<&'static str, f64>,
    /// IPv4, 10 routes: each variant's ns above the floor (by name), the
    /// floor's ns, and (added by the caller) telemetry off's ns.
    above_v4: BTreeMap<&'static str, f64>,
    floor_v4: f64,
    telemetry_off_v4: f64,
}

/// The rows with a goal that get a budget table: name, the program whose
/// cost it is, what that cost is read against, goal, path, and what the
/// remainder holds.
struct BudgetRow {
    name: &'static str,
    /// The row's own program: a variant's (whose verified program the
    /// path is checked against), or telemetry on.
    program: Profiled,
    against: Against,
    goal: f64,
    steps: fn() -> Vec<budget::Step>,
    remainder: &'static str,
}

/// A program the budgets' line profiles sample (IPv4, part 1's frame).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Profiled {
    Variant(Variant),
    /// The qp pipeline with per-QP telemetry on (true) or off, on the
    /// telemetry rows' stream of one QP.
    Telemetry(bool),
}

impl Profiled {
    /// The features its program is loaded with.
    fn features(self) -> Features {
        match self {
            Profiled::Variant(v) => v.features(),
            Profiled::Telemetry(on) => telemetry::features(on),
        }
    }
}

/// What a budget row's cost is read against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Against {
    /// The trivial redirect: the row's cost above the floor.
    Floor,
    /// The qp row: a marginal row's cost is what it adds to qp.
    Qp,
    /// The qp pipeline with telemetry off (telemetry's marginal).
    TelemetryOff,
}

impl Against {
    /// As the budget's heading says it ("+54.0 ns above qp").
    fn text(self) -> &'static str {
        match self {
            Against::Floor => "the floor",
            Against::Qp => "qp",
            Against::TelemetryOff => "telemetry off",
        }
    }

    /// The program whose profile a marginal row's is read against.
    fn profiled(self) -> Option<Profiled> {
        match self {
            Against::Floor => None,
            Against::Qp => Some(Profiled::Variant(QP)),
            Against::TelemetryOff => Some(Profiled::Telemetry(false)),
        }
    }
}

/// The qp row, what the marginal rows are read against.
const QP: Variant = Variant::Pipeline(Pipeline::Qp);

impl BudgetRow {
    /// A marginal row: its cost and path are what it adds to another row.
    fn is_marginal(&self) -> bool {
        self.against != Against::Floor
    }

    /// The variant whose part-1 row is this row's cost, if it is one.
    fn variant(&self) -> Option<Variant> {
        match self.program {
            Profiled::Variant(v) => Some(v),
            Profiled::Telemetry(_) => None,
        }
    }

    /// The programs whose line profiles place the remainder: the row's,
    /// and for a marginal row the one it is read against.
    fn profiled(&self) -> (Profiled, Option<Profiled>) {
        (self.program, self.against.profiled())
    }
}

/// The budget row whose cost is the one of `variant`'s row.
fn budget_row_of(variant: Variant) -> Option<&'static BudgetRow> {
    BUDGET_ROWS.iter().find(|b| b.variant() == Some(variant))
}

/// The budget row of per-QP telemetry (its cost comes from the telemetry
/// rows, which run on instances of their own).
const TELEMETRY_BUDGET: BudgetRow = BudgetRow {
    name: "marginal: telemetry on (4096 QPs)",
    program: Profiled::Telemetry(true),
    against: Against::TelemetryOff,
    goal: TELEMETRY_GOAL_NS,
    steps: || budget::TELEMETRY_STEPS.to_vec(),
    remainder: "the rest of `observe`'s path around the QP entry: the PSN's read from the BTH where the pipeline found it, the trace filter's test, the tick's compare for the coarse clock",
};

const REST_OF_PATH: &str = "the rest of the instruction path, spread over many lines (see the profiles below): the feature and error tests, the entry and exit";

const BUDGET_ROWS: [BudgetRow; 7] = [
    BudgetRow {
        name: "rocev2 qp",
        program: Profiled::Variant(QP),
        against: Against::Floor,
        goal: 40.0,
        steps: || budget::QP_PATH.to_vec(),
        remainder: REST_OF_PATH,
    },
    BudgetRow {
        name: "rocev2 five-tuple",
        program: Profiled::Variant(Variant::Pipeline(Pipeline::FiveTuple)),
        against: Against::Floor,
        goal: 45.0,
        steps: || budget::QP_PATH.to_vec(),
        remainder: REST_OF_PATH,
    },
    BudgetRow {
        name: "rocev2 flowlet",
        program: Profiled::Variant(Variant::Pipeline(Pipeline::Flowlet)),
        against: Against::Floor,
        goal: 80.0,
        steps: || budget::FLOWLET_PATH.to_vec(),
        remainder: "as qp's, plus the flowlet function's own moves around its measured steps",
    },
    BudgetRow {
        name: "rocev2 flowlet+ECN+classes",
        program: Profiled::Variant(Variant::Pipeline(Pipeline::Full)),
        against: Against::Floor,
        goal: 100.0,
        steps: || [budget::FLOWLET_PATH, budget::CLASSES_ECN_STEPS].concat(),
        remainder: "as flowlet's, plus the class loop around the class tests (the live count, the index), the call's argument packing for the virtual queue and, while the queue is between its thresholds, `bpf_get_prandom_u32`",
    },
    BudgetRow {
        name: "marginal: ECN virtual queue",
        program: Profiled::Variant(Variant::QpEcn),
        against: Against::Qp,
        goal: ECN_GOAL_NS,
        steps: || budget::ECN_STEPS.to_vec(),
        remainder: "the egress entry's find around its lookups (`egress_entry`), the call's argument packing and, while the queue is between its thresholds, `bpf_get_prandom_u32`",
    },
    BudgetRow {
        name: "marginal: every feature loaded, unused",
        program: Profiled::Variant(Variant::QpAllFeaturesLoaded),
        against: Against::Qp,
        goal: UNUSED_FEATURES_GOAL_NS,
        steps: || budget::UNUSED_STEPS.to_vec(),
        remainder: "the feature tests and the branches around the three lookups (each `enabled()` test stays: the load of a frozen global)",
    },
    TELEMETRY_BUDGET,
];

/// The full path a budget row's program runs (a marginal row's steps on
/// top of the qp path), for the check against its verified program.
fn checked_path(b: &BudgetRow) -> Vec<budget::Step> {
    let steps = (b.steps)();
    if b.is_marginal() {
        [budget::QP_PATH.to_vec(), steps].concat()
    } else {
        steps
    }
}

/// A verified program's map references and calls.
fn static_counts(programs: &mut impl Programs, program: &str) -> Result<budget::StaticCounts> {
    let fd = std::os::fd::AsFd::as_fd(programs.program(program)?.fd()?);
    let insns = jit_lines::xlated_insns(fd)?;
    Ok(budget::StaticCounts::of_xlated(&insns, |id| {
        let info = aya::maps::MapInfo::from_id(id).ok()?;
        let name = info.name_as_str()?;
        Some(rocev2_common::maps::spec_of(name).map_or(name, |m| m.name).to_owned())
    }))
}

/// Line profiles of the budget rows' programs, each taken once.
#[derive(Default)]
struct Profiles(Vec<(Profiled, profile::Profile)>);

impl Profiles {
    fn get(&self, p: Profiled) -> Option<&profile::Profile> {
        self.0.iter().find(|(q, _)| *q == p).map(|(_, profile)| profile)
    }

    /// Profiles `p` for `seconds` unless it has been.
    fn take(&mut self, p: Profiled, seconds: f64) -> Result<()> {
        if self.get(p).is_none() {
            self.0.push((p, profile_of(p, seconds)?));
        }
        Ok(())
    }
}

/// The line profile of one program the budgets read.
fn profile_of(p: Profiled, seconds: f64) -> Result<profile::Profile> {
    let frame = bench_frame(false, 255, [2, 0, 0, 0, 0, 0xFE]);
    match p {
        Profiled::Variant(v) => {
            let mut dp = test_run_dataplane_with(DEFAULT_FLOWLET_TABLE_SIZE, v.features())?;
            v.configure(&mut dp)?;
            profile::profile_program(&mut dp, XDP_PROGRAM, &[&frame], &format!("{}, IPv4", v.name()), seconds)
        }
        Profiled::Telemetry(on) => telemetry::profile(on, seconds),
    }
}

/// Each budget row's remainder placed on lines: the profiles of its
/// program and, for a marginal row, of the one it is read against (each
/// profiled once), scaled to their costs above the floor in `p1`. No
/// profiles when `seconds` is 0.
fn place_budgets(p1: &Part1, seconds: f64) -> Result<(BTreeMap<&'static str, placement::Placement>, Profiles)> {
    let mut profiles = Profiles::default();
    let mut placed = BTreeMap::new();
    if seconds <= 0.0 {
        return Ok((placed, profiles));
    }
    eprintln!("bench: line profiles of the budget rows ({seconds} s each)");
    // Part 1's ns above the floor of a profiled program (IPv4, 10 routes).
    let measured = |p: Profiled| match p {
        Profiled::Variant(v) => p1.above_v4.get(v.name()).copied(),
        // Telemetry on is only read against off (its cost is added above).
        Profiled::Telemetry(_) => Some(p1.telemetry_off_v4 - p1.floor_v4),
    };
    for b in &BUDGET_ROWS {
        let Some(cost) = p1.costs.get(b.name) else { continue };
        let (row, against) = b.profiled();
        let against_ns = against.map(measured);
        // A marginal row's profile is scaled to the other row's cost plus
        // its own measured against it (the median of per-round pairs, not
        // the difference of two medians above the floor), so the two
        // profiles' difference places exactly the marginal's cost.
        let row_ns = match against_ns {
            Some(Some(a)) => Some(a + cost),
            _ => measured(row),
        };
        let Some(row_ns) = row_ns else { continue };
        profiles.take(row, seconds)?;
        if let Some(a) = against {
            profiles.take(a, seconds)?;
        }
        let Some(r) = profiles.get(row) else { continue };
        let a = match (against, against_ns) {
            (Some(a), Some(Some(ns))) => Some((profiles.get(a).expect("profiled above"), ns)),
            (None, _) => None,
            _ => continue,
        };
        // What the row's program loads that the other one does not.
        let added = against.map_or(Features::NONE, |a| row.features().without(a.features()));
        placed.insert(b.name, placement::place(*cost, (r, row_ns), a, placement::function_at).adding(added));
    }
    Ok((placed, profiles))
}

/// The primitive rows and every budget table, from one run's numbers,
/// each with its remainder placed on lines where `placed` has it.
fn budget_report(p1: &Part1, placed: &BTreeMap<&'static str, placement::Placement>) -> (Vec<Row>, String) {
    let mut rows = Vec::new();
    for p in budget::Primitive::ALL {
        let each = p1.floors.ns(p);
        rows.push(row(
            "1 per-packet",
            format!("primitive: {}", p.what()),
            format!("`{}`: the floor + {} x this", p.program(), p.repeat()),
            format!("{each:.1} ns"),
            "per operation: median over rounds of (run - floor) / count",
            "",
        ));
    }
    let mut md = String::from(BUDGET_HEADING);
    for b in &BUDGET_ROWS {
        let Some(cost) = p1.costs.get(b.name) else { continue };
        let s = budget::split(*cost, &(b.steps)(), &p1.floors);
        match placed.get(b.name) {
            Some(p) => {
                md.push_str(&budget::render(b.name, b.against.text(), b.goal, &s, PLACED_BELOW));
                md.push_str(&placement::render(p, &s, &p1.floors));
            }
            None => md.push_str(&budget::render(b.name, b.against.text(), b.goal, &s, b.remainder)),
        }
    }
    (rows, md)
}

/// The remainder row's note when the row's profile places it.
const PLACED_BELOW: &str = "placed on lines by the row's profile, in the table below";

const BUDGET_HEADING: &str = "\n## Budgets of the missed goals (IPv4, 10 routes, this run)\n\nEach table splits a row's cost (above the floor, or for a marginal row above the row it is read against) into the primitives its packet's path takes, each at its cost measured in this run (the `primitive:` rows of part 1: a program per primitive, the floor plus 8 chained operations, or 8 on separate copies for the rewrite, the counter adds, the IPv4 header's reads and tests, the flow key's stores and the class tests, or 8 chained on separate copies of their state for the ECN virtual queue, the flowlet decision and telemetry's QP entry, or one parse, interleaved with the floor in every round). The path is listed step by step in `rocev2-user/src/testbed/bench/budget.rs` (from the source and the IPv4 path traced instruction by instruction), and before measuring the bench checks each listed lookup and call against the program the kernel verified for that row (the map is referenced there at least as often, the program has at least as many BPF-to-BPF calls). The floor itself (one devmap redirect, the test run's own work) is in every row and in no budget. A primitive measured alone is hot in the cache and alone in the pipeline's out-of-order window, so the sum can be above or below what the same steps cost inside the pipeline; the remainder is the rest of the path, and its error. Under each table, the row's own line profile places the remainder on source lines (see Reading above, and `placement.rs`).\n\n";

fn part1(args: &BenchArgs, control: &mut Vec<Row>, reading: &mut Vec<String>) -> Result<Part1> {
    let mut rows = Vec::new();
    let mut worst_full = f64::MIN;
    let mut floors = budget::Floors::default();
    let mut costs = BTreeMap::new();
    let (mut above_v4, mut floor_v4) = (BTreeMap::new(), f64::NAN);
    // One instance per row, loaded with that row's features and configured
    // once (set_egress cannot be undone); routes change between the two
    // route sets.
    eprintln!("bench: loading {} dataplanes", VARIANTS.len());
    let mut floor = test_run_floor()?;
    for p in budget::Primitive::ALL {
        floor.xdp(p.program())?;
    }
    let mut instances = Vec::new();
    for v in VARIANTS {
        let mut dp = test_run_dataplane_with(DEFAULT_FLOWLET_TABLE_SIZE, v.features())?;
        v.configure(&mut dp)?;
        instances.push(dp);
    }
    // Each budget's path against the program verified for its row.
    for b in &BUDGET_ROWS {
        let Some(v) = b.variant() else { continue };
        let i = VARIANTS.iter().position(|x| *x == v).expect("a variant of the table");
        budget::check_path(b.name, &checked_path(b), &static_counts(&mut instances[i], XDP_PROGRAM)?)?;
    }
    for big in [false, true] {
        let routes = if big { "100k+100k routes" } else { "10 routes" };
        eprintln!("bench: per-packet cost, {routes}");
        if big {
            // Part 3: loading 100,000 routes per family through sync_routes.
            let mut wanted = base_routes();
            let v4 = random_routes(BIG_ROUTES, false, 42);
            let v6 = random_routes(BIG_ROUTES, true, 42);
            wanted.extend(v4.iter().map(|p| (*p, GROUP)));
            let t = Instant::now();
            instances[0].sync_routes(&wanted)?;
            let v4_secs = t.elapsed().as_secs_f64();
            wanted.extend(v6.iter().map(|p| (*p, GROUP)));
            let t = Instant::now();
            instances[1].sync_routes(&wanted)?;
            let both_secs = t.elapsed().as_secs_f64();
            for (v, dp) in VARIANTS.iter().zip(instances.iter_mut()) {
                if !v.marginal() {
                    dp.sync_routes(&wanted)?;
                }
            }
            let ok = if v4_secs < 1.0 { "met" } else { "MISSED" };
            let ok2 = if both_secs < 2.0 { "met" } else { "MISSED" };
            control.push(row(
                "3 control",
                "load 100,000 IPv4 routes (/24)",
                "Dataplane::sync_routes into an empty table, one BPF_MAP_UPDATE_ELEM each",
                format!("{v4_secs:.3} s"),
                format!("{:.2} µs/route", v4_secs * 1e6 / BIG_ROUTES as f64),
                format!("< 1 s: {ok}"),
            ));
            control.push(row(
                "3 control",
                "load 100,000 IPv4 + 100,000 IPv6 routes",
                "sync_routes of the whole set into an empty table",
                format!("{both_secs:.3} s"),
                format!("{:.2} µs/route", both_secs * 1e6 / (wanted.len() as f64)),
                format!("< 1 s per 100k: {ok2}"),
            ));
        }
        // Measurements interleave: every round measures every row once.
        let mut samples: BTreeMap<(usize, bool), Vec<f64>> = BTreeMap::new();
        let mut primitive_samples: BTreeMap<budget::Primitive, Vec<f64>> = BTreeMap::new();
        let frames = [bench_frame(false, 255, [2, 0, 0, 0, 0, 0xFE]), bench_frame(true, 255, [2, 0, 0, 0, 0, 0xFE])];
        let twins = [false, true].map(|v6| bench_frame_to(cache_twin(v6), 255, [2, 0, 0, 0, 0, 0xFE]));
        let qp_index = VARIANTS.iter().position(|v| *v == Variant::Pipeline(Pipeline::Qp)).expect("qp row");
        let flowlet_index =
            VARIANTS.iter().position(|v| *v == Variant::Pipeline(Pipeline::Flowlet)).expect("flowlet row");
        let t_rounds = Instant::now();
        for _round in 0..args.rounds {
            for (v6, frame) in [false, true].into_iter().zip(&frames) {
                let ns = cost_ns(&mut floor, XDP_REDIRECT_PROGRAM, frame, args.packets)?;
                samples.entry((0, v6)).or_default().push(ns);
            }
            if !big {
                // The primitives, on the IPv4 frame, against this round's floor.
                let floor_ns = *samples[&(0, false)].last().expect("measured above");
                for p in budget::Primitive::ALL {
                    let ns = cost_ns(&mut floor, p.program(), &frames[0], args.packets)?;
                    primitive_samples.entry(p).or_default().push((ns - floor_ns) / f64::from(p.repeat()));
                }
            }
            for (i, (v, dp)) in VARIANTS.iter().zip(instances.iter_mut()).enumerate() {
                if big && v.marginal() {
                    continue;
                }
                for (v6, frame) in [false, true].into_iter().zip(&frames) {
                    samples.entry((i + 1, v6)).or_default().push(cost_ns(dp, XDP_PROGRAM, frame, args.packets)?);
                }
            }
            // The qp pipeline when every packet misses the route cache.
            for (v6, (frame, twin)) in [false, true].into_iter().zip(frames.iter().zip(&twins)) {
                let ns =
                    cost_ns_frames(&mut instances[qp_index], XDP_PROGRAM, &[frame, twin], args.packets, TEST_REPEAT)?;
                samples.entry((CACHE_MISS_ROW, v6)).or_default().push(ns);
            }
        }
        eprintln!("bench:   {} rounds in {:.1} s", args.rounds, t_rounds.elapsed().as_secs_f64());
        for (p, v) in primitive_samples {
            floors.0.insert(p, median(v));
        }
        for v6 in [false, true] {
            let fam = if v6 { "IPv6" } else { "IPv4" };
            let floor = median(samples[&(0, v6)].clone());
            // Row a against row b: the median over rounds of their difference
            // within a round (the load drifts between rounds; within one,
            // rows are measured a moment apart).
            let paired = |a: usize, b: usize| {
                median(samples[&(a, v6)].iter().zip(&samples[&(b, v6)]).map(|(x, y)| x - y).collect())
            };
            let (qp_row, keyed_flowlet_row) = (qp_index + 1, flowlet_index + 1);
            rows.push(row(
                "1 per-packet",
                "trivial redirect (floor)",
                format!("{fam}, {routes}"),
                format!("{floor:.1} ns"),
                "floor",
                "",
            ));
            for (i, v) in VARIANTS.iter().enumerate() {
                let Some(ns) = samples.get(&(i + 1, v6)).map(|s| median(s.clone())) else { continue };
                let above = paired(i + 1, 0);
                let against_qp = paired(i + 1, qp_row);
                if !big && !v6 {
                    above_v4.insert(v.name(), above);
                    floor_v4 = floor;
                }
                if let (false, false, Some(b)) = (big, v6, budget_row_of(*v)) {
                    costs.insert(b.name, if b.is_marginal() { against_qp } else { above });
                }
                let (relative, target) = match v {
                    Variant::Pipeline(p) => {
                        if *p == Pipeline::Full {
                            worst_full = worst_full.max(above);
                        }
                        let t = p.target_ns();
                        (format!("+{above:.1} ns"), at_most_ns(above, t))
                    }
                    Variant::FlowletKeyless => (
                        format!("+{above:.1} ns ({:+.1} ns against the keyed table)", paired(i + 1, keyed_flowlet_row)),
                        String::new(),
                    ),
                    Variant::QpNoCounters => (format!("counters cost {:+.1} ns", -against_qp), String::new()),
                    Variant::QpHashV1 => {
                        // Paired by round (each round measures both rows), so
                        // the machine's load, which drifts between rounds,
                        // mostly cancels out of the ratio.
                        let ratios = samples[&(i + 1, v6)].iter().zip(&samples[&(qp_row, v6)]).map(|(a, b)| a / b);
                        let ratio = median(ratios.collect());
                        (
                            format!(
                                "{against_qp:+.1} ns against qp (v2); v1/v2 time {ratio:.3}, median of per-round ratios"
                            ),
                            String::new(),
                        )
                    }
                    Variant::QpEcn => (format!("{against_qp:+.1} ns against qp"), at_most_ns(against_qp, ECN_GOAL_NS)),
                    Variant::QpAllFeaturesLoaded => {
                        (format!("{against_qp:+.1} ns against qp"), at_most_ns(against_qp, UNUSED_FEATURES_GOAL_NS))
                    }
                    _ => (format!("{against_qp:+.1} ns against qp"), String::new()),
                };
                rows.push(row(
                    "1 per-packet",
                    v.name(),
                    format!("{fam}, {routes}"),
                    format!("{ns:.1} ns"),
                    relative,
                    target,
                ));
            }
            let ns = median(samples[&(CACHE_MISS_ROW, v6)].clone());
            rows.push(row(
                "1 per-packet",
                "rocev2 qp, every packet a route-cache miss",
                format!("{fam}, {routes}"),
                format!("{ns:.1} ns"),
                format!("+{:.1} ns ({:+.1} ns against qp)", paired(CACHE_MISS_ROW, 0), paired(CACHE_MISS_ROW, qp_row)),
                "",
            ));
        }
        if !big {
            let i = instructions(&mut floor, XDP_REDIRECT_PROGRAM)?;
            reading.push(instructions_line(&i, "floor"));
            let i = instructions(&mut floor, budget::Primitive::PaddedFloor.program())?;
            reading.push(instructions_line(&i, "the padded floor (code never run, to about qp's JITed size)"));
            for (v, dp) in VARIANTS.iter().zip(instances.iter_mut()) {
                let i = instructions(dp, XDP_PROGRAM)?;
                reading.push(instructions_line(&i, v.name()));
            }
        }
    }
    drop(instances);

    // Group change: publish a new member list, then test-run until a packet
    // goes to one of the new members.
    eprintln!("bench: group change latency");
    let mut dp = test_run_dataplane(DEFAULT_FLOWLET_TABLE_SIZE)?;
    let frame = bench_frame(false, 64, [2, 0, 0, 0, 0, 0xFE]);
    let mut publish_us = Vec::new();
    let mut effect_us = Vec::new();
    let mut out = vec![0u8; frame.len() + 256];
    for i in 0..200u32 {
        let tag = if i % 2 == 0 { 0xCC } else { 0xBB };
        let members = lo_members(tag);
        let t = Instant::now();
        dp.maps.publish_group(GROUP, HashMode::Qp, &members)?;
        publish_us.push(t.elapsed().as_secs_f64() * 1e6);
        let prog = dp.xdp_program(XDP_PROGRAM)?;
        loop {
            let r = prog.test_run(TestRunOptions {
                data_in: Some(&frame),
                data_out: Some(&mut out),
                ..Default::default()
            })?;
            if r.return_value == XDP_REDIRECT && out[1] == tag {
                break;
            }
            if t.elapsed() > Duration::from_secs(1) {
                bail!("a group change did not take effect within 1 s");
            }
        }
        effect_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut sorted = effect_us.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let p99 = sorted[sorted.len() * 99 / 100];
    control.push(row(
        "3 control",
        "group membership change takes effect",
        "publish_group (4 members, new MACs), then test-run packets until one leaves by a new member; 200 changes",
        format!("median {:.1} µs", median(effect_us)),
        format!("p99 {p99:.1} µs; publish_group alone median {:.1} µs", median(publish_us)),
        String::new(),
    ));
    drop(dp);

    // Memory: default config vs a large one.
    eprintln!("bench: map memory");
    let mut dp = test_run_dataplane(DEFAULT_FLOWLET_TABLE_SIZE)?;
    let (small, per_small) = dataplane_memlock(&mut dp)?;
    drop(dp);
    let mut dp = test_run_dataplane(1 << 20)?;
    let mut wanted = base_routes();
    wanted.extend(random_routes(BIG_ROUTES, false, 42).into_iter().map(|p| (p, GROUP)));
    wanted.extend(random_routes(BIG_ROUTES, true, 42).into_iter().map(|p| (p, GROUP)));
    dp.sync_routes(&wanted)?;
    let (large, per_large) = dataplane_memlock(&mut dp)?;
    drop(dp);
    let top =
        |v: &[(String, u64)]| v.iter().take(3).map(|(n, b)| format!("{n} {}", mib(*b))).collect::<Vec<_>>().join(", ");
    control.push(row(
        "3 control",
        "map memory, default config",
        "10 routes, 65,536-flow flowlet table (memlock of every map)",
        mib(small),
        format!("largest: {}", top(&per_small)),
        String::new(),
    ));
    control.push(row(
        "3 control",
        "map memory, large config",
        "100k IPv4 + 100k IPv6 routes, 1,048,576-flow flowlet table",
        mib(large),
        format!("largest: {}", top(&per_large)),
        String::new(),
    ));
    Ok(Part1 { rows, worst_full, floors, costs, above_v4, floor_v4, telemetry_off_v4: f64::NAN })
}

// ------------------------------------------------------------ report

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_owned()))
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!("{model}, {cores} cores, Linux {kernel}, {date}")
}

fn render_table(rows: &[Row]) -> String {
    let mut s = String::from("| part | what | setup | result | relative | target |\n|---|---|---|---|---|---|\n");
    for r in rows {
        let _ = writeln!(s, "| {} | {} | {} | {} | {} | {} |", r.part, r.what, r.setup, r.result, r.relative, r.target);
    }
    s
}

pub fn run(args: &BenchArgs) -> Result<()> {
    crate::sys::privileges::check()?;
    if let Some(name) = &args.r#loop {
        return profile::profile_loop(args, name);
    }
    if args.bridge_only {
        let mut rows = bridge::per_packet_rows(args)?;
        rows.extend(bridge::forwarding_rows(args, GenMode::LiveFrames, None)?);
        print!("{}", render_table(&rows));
        return Ok(());
    }
    if args.telemetry_only {
        print!("{}", render_table(&telemetry::telemetry_rows(args)?.0));
        return Ok(());
    }
    if args.per_packet_only {
        let mut p1 = part1(args, &mut Vec::new(), &mut Vec::new())?;
        let (placed, _) = place_budgets(&p1, args.profile_seconds)?;
        let (primitives, budgets) = budget_report(&p1, &placed);
        p1.rows.extend(primitives);
        print!("{}{budgets}", render_table(&p1.rows));
        return Ok(());
    }
    if let Some(name) = &args.profile {
        let p = if let Some(program) = profile::tools_program_named(name) {
            // The floor or a primitive, on part 1's frame, as part 1 runs it.
            let frame = bench_frame(args.profile_v6, 255, [2, 0, 0, 0, 0, 0xFE]);
            let mut floor = test_run_floor()?;
            profile::profile_program(&mut floor, program, &[&frame], program, args.profile_seconds)?
        } else {
            profile::profile(profile::pipeline_named(name)?, args.profile_v6, args.profile_seconds)?
        };
        print!("{}", p.render(args.profile_rows));
        return Ok(());
    }
    let started = Instant::now();
    let machine = machine();
    let mut control = Vec::new();
    let mut reading = Vec::new();
    let mut notes = Vec::new();
    let mut p1 = part1(args, &mut control, &mut reading)?;
    let (telemetry_rows, telemetry_cost, telemetry_off) = telemetry::telemetry_rows(args)?;
    p1.rows.extend(telemetry_rows);
    p1.costs.insert(TELEMETRY_BUDGET.name, telemetry_cost);
    p1.telemetry_off_v4 = telemetry_off;
    let (placed, mut profiled) = place_budgets(&p1, args.profile_seconds)?;
    let (primitive_rows, budgets) = budget_report(&p1, &placed);
    p1.rows.extend(primitive_rows);
    p1.rows.extend(bridge::per_packet_rows(args)?);
    // The qp and full pipelines' whole profiles (the budgets' own, unless
    // they took none).
    let mut profiles = Vec::new();
    for p in [Pipeline::Qp, Pipeline::Full] {
        let p = Profiled::Variant(Variant::Pipeline(p));
        profiled.take(p, args.profile_seconds.max(1.0))?;
        profiles.push(profiled.get(p).map(|p| p.render(profile::REPORT_ROWS)).unwrap_or_default());
    }
    // The same IPv4, 10-route costs the budgets' profiles are scaled to.
    let part1_cost = |r: FwdRow| {
        let pipeline = |p: Pipeline| p1.above_v4.get(Variant::Pipeline(p).name()).copied();
        match r {
            FwdRow::Rocev2(p) => pipeline(p),
            FwdRow::Telemetry => pipeline(Pipeline::Qp).zip(p1.costs.get(TELEMETRY_BUDGET.name)).map(|(qp, t)| qp + t),
            _ => None,
        }
    };
    let p2 = part2(args, &mut notes, &part1_cost)?;
    let bridged = bridge::forwarding_rows(args, p2.mode, p2.qp_vs_kernel)?;
    let rocev2 = std::env::current_exe().context("cannot find the rocev2 binary")?;
    let p4 = kernel_routes::part4(&rocev2, &mut notes)?;
    let p5 = lab_build::part5(&rocev2, &mut notes)?;
    let p6 = collective_model::part6(&mut notes)?;
    reading.push(String::new());
    let mut rows = p1.rows;
    rows.extend(p2.rows);
    rows.extend(bridged);
    rows.extend(p4);
    rows.extend(p5);
    rows.extend(p6);
    rows.extend(control);
    let table = render_table(&rows);
    println!("Machine: {machine}\n\n{table}");
    let worst_full = p1.worst_full;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Benchmarks\n\nMade by `cargo xtask bench` (`rocev2 bench`), {:.0} s.\n\nMachine: {machine}\n",
        started.elapsed().as_secs_f64()
    );
    md.push_str(&table);
    md.push_str("\n## How\n\n");
    md.push_str(&format!(
        "- Part 1: BPF_PROG_TEST_RUN of a RoCEv2 WRITE_ONLY (QP 0x100) to 10.1.0.1 / fd01::1 ({} bytes / {} bytes), a group of 4 members on lo. Each measurement is {} calls with `repeat: 1` (the kernel's per-call time, which includes its two clock reads; the floor pays the same), the median of {} rounds with rows interleaved within a round: {} runs per row in all; a row's ns above the floor, or against another row, is the median over rounds of the difference within a round (the load drifts between rounds, the rows of one round are measured moments apart). Not one call with `repeat: 1_000_000`: the program would decrement the TTL of the one buffer the kernel repeats on (TTL-expired after 254 runs), and every call with repeat > 1 first swaps the program into the XDP dispatcher, so its first runs are cache-cold (five-tuple measured 364 ns per packet at repeat 250 and 950 ns at repeat 10 against about 220 ns at repeat 1). The floor is `{XDP_REDIRECT_PROGRAM}`: one devmap redirect, no parsing. 100k routes = 100,000 random /24 + 100,000 random /64 (seeded) plus the 10.\n",
        bench_frame(false, 255, [0; 6]).len(),
        bench_frame(true, 255, [0; 6]).len(),
        args.packets,
        args.rounds,
        args.packets * args.rounds as u64
    ));
    md.push_str(&format!(
        "- Part 2: namespaces sender -> switch -> {UPLINKS} uplinks over veths, native XDP. The generator is `rocev2_user::tools::gen` (64 QPs, NIC-style source ports, 4-packet WRITE messages, 1024-byte payload, IPv4); receivers run `{XDP_DROP_PROGRAM}` and are counted from their rx counters (`ip -s link`). {} s per measurement, median of {} rounds, row order rotated each round. Kernel row: `ip route 10.1.0.0/16 nexthop via 10.0.1.2 nexthop via 10.0.2.2`, `fib_multipath_hash_policy=1`, static neighbours, nothing attached to the switch port.\n",
        args.seconds, args.fwd_rounds
    ));
    md.push_str("- Every pipeline row hashes with `hash_version = 2`, what new configs write. The `hash_version = 1` row is the qp pipeline with version 1 (the placement of configs without the key), measured in the same rounds: its ratio is the median over rounds of its time over the qp row's time in that round, so the load that drifts between rounds mostly cancels out.\n");
    for n in &notes {
        md.push_str(&format!("- {n}\n"));
    }
    md.push_str(&bridge::how());
    md.push_str(telemetry::HOW);
    md.push_str("- Part 3: routes through `Dataplane::sync_routes` (aya 0.14 has no BPF_MAP_UPDATE_BATCH wrapper); memory is `memlock` from /proc/self/fdinfo of every map the programs use.\n");
    md.push_str("\n## Reading\n\n");
    md.push_str(&format!(
        "Full pipeline worst case above the floor in part 1: +{worst_full:.1} ns.\n\nProgram sizes:\n\n"
    ));
    for r in &reading {
        md.push_str(r);
        md.push('\n');
    }
    md.push_str(READING);
    md.push_str(&budgets);
    md.push_str(profile::HEADING);
    for p in &profiles {
        md.push('\n');
        md.push_str(p);
    }
    std::fs::write(&args.out, &md).with_context(|| format!("cannot write {}", args.out.display()))?;
    eprintln!("bench: wrote {} in {:.0} s", args.out.display(), started.elapsed().as_secs_f64());
    Ok(())
}

/// How to read the report (prose, kept beside the code that measures it).
const READING: &str = include_str!("reading.md");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_row_is_read_against_what_its_variant_is_measured_against() {
        for b in &BUDGET_ROWS {
            assert_eq!(b.profiled().1.is_some(), b.is_marginal(), "{}", b.name);
            match b.variant() {
                // A pipeline's cost is above the floor; a marginal variant's against qp.
                Some(v) => assert_eq!(b.against, if v.marginal() { Against::Qp } else { Against::Floor }, "{}", b.name),
                None => assert_eq!((b.program, b.against), (Profiled::Telemetry(true), Against::TelemetryOff)),
            }
        }
    }
}
