//! Part 1's floors and budgets: what each primitive the pipeline pays for
//! costs on this machine (a program per primitive in the tools object,
//! measured like every part-1 row, interleaved with the floor), and for
//! each row with a missed goal, its cost above what it is read against
//! split into those primitives (how many the packet's path takes, times
//! the measured cost of one) and the remainder.
//!
//! A path is listed step by step ([`Step`]: the primitive and the map,
//! helper or function it is on the path for), from the program's source
//! and its IPv4 path traced instruction by instruction; the bench checks
//! each listed map lookup and call against the program the kernel
//! verified for that row ([`check_path`]): a map the path names must be
//! referenced there at least as often as the path uses it, and the
//! program must have at least as many BPF-to-BPF calls.

use std::collections::BTreeMap;

use anyhow::{bail, Result};

/// Steps per primitive program (the tools object repeats by the same constant).
const REPEAT: u32 = rocev2_common::BENCH_PRIMITIVE_REPEAT;

/// Something the pipeline pays for, measured by a program of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Primitive {
    Parse,
    HashV2Ipv4,
    HashV2Ipv6,
    HashV1,
    Array,
    PerCpuArray,
    LruHash,
    Clock,
    CoarseClock,
    Jiffies,
    Call,
    Rewrite,
    CounterAdds,
    IngressPort,
    FlowKeyStores,
    GroupChecks,
    RouteCache,
    Ipv4Checks,
    ClassMatch,
    EcnQueue,
    FlowletStep,
    QpEntry,
    /// Not a step of any path: the floor padded to the qp pipeline's
    /// JITed size, what size alone costs (the entry's evidence).
    PaddedFloor,
}

impl Primitive {
    pub const ALL: [Primitive; 23] = [
        Primitive::Array,
        Primitive::PerCpuArray,
        Primitive::LruHash,
        Primitive::Clock,
        Primitive::CoarseClock,
        Primitive::Jiffies,
        Primitive::Call,
        Primitive::Parse,
        Primitive::HashV2Ipv4,
        Primitive::HashV2Ipv6,
        Primitive::HashV1,
        Primitive::Rewrite,
        Primitive::CounterAdds,
        Primitive::IngressPort,
        Primitive::FlowKeyStores,
        Primitive::GroupChecks,
        Primitive::RouteCache,
        Primitive::Ipv4Checks,
        Primitive::ClassMatch,
        Primitive::EcnQueue,
        Primitive::FlowletStep,
        Primitive::QpEntry,
        Primitive::PaddedFloor,
    ];

    /// The tools object's program that measures it.
    pub fn program(self) -> &'static str {
        match self {
            Primitive::Parse => "rocev2_prim_parse",
            Primitive::HashV2Ipv4 => "rocev2_prim_hash_v2_v4",
            Primitive::HashV2Ipv6 => "rocev2_prim_hash_v2_v6",
            Primitive::HashV1 => "rocev2_prim_hash_v1",
            Primitive::Array => "rocev2_prim_array",
            Primitive::PerCpuArray => "rocev2_prim_percpu",
            Primitive::LruHash => "rocev2_prim_hash",
            Primitive::Clock => "rocev2_prim_clock",
            Primitive::CoarseClock => "rocev2_prim_coarse",
            Primitive::Jiffies => "rocev2_prim_jiffies",
            Primitive::Call => "rocev2_prim_call",
            Primitive::Rewrite => "rocev2_prim_rewrite",
            Primitive::CounterAdds => "rocev2_prim_counters",
            Primitive::IngressPort => "rocev2_prim_ingress",
            Primitive::FlowKeyStores => "rocev2_prim_flow_key",
            Primitive::GroupChecks => "rocev2_prim_group",
            Primitive::RouteCache => "rocev2_prim_route_cache",
            Primitive::Ipv4Checks => "rocev2_prim_ipv4_checks",
            Primitive::ClassMatch => "rocev2_prim_class",
            Primitive::EcnQueue => "rocev2_prim_ecn",
            Primitive::FlowletStep => "rocev2_prim_flowlet",
            Primitive::QpEntry => "rocev2_prim_qp_entry",
            Primitive::PaddedFloor => "rocev2_prim_padded",
        }
    }

    /// How many times its program does it.
    pub fn repeat(self) -> u32 {
        match self {
            Primitive::Parse | Primitive::PaddedFloor => 1,
            _ => REPEAT,
        }
    }

    /// What one operation is.
    pub fn what(self) -> &'static str {
        match self {
            Primitive::Parse => "parse of Ethernet + IPv4 (checksum checked) + UDP + BTH, with bounds checks",
            Primitive::HashV2Ipv4 => "member hash, hash_version 2, IPv4 key (4 words + finalization)",
            Primitive::HashV2Ipv6 => "member hash, hash_version 2, IPv6 key (10 words + finalization)",
            Primitive::HashV1 => "member hash, hash_version 1 (11 words + finalization)",
            Primitive::Array => "ARRAY lookup (inlined by the verifier)",
            Primitive::PerCpuArray => "PERCPU_ARRAY lookup (inlined by the verifier)",
            Primitive::LruHash => "LRU_HASH lookup, a 44-byte flowlet-table key",
            Primitive::Clock => "`bpf_ktime_get_ns` (the precise clock)",
            Primitive::CoarseClock => "`bpf_ktime_get_coarse_ns` (the coarse clock)",
            Primitive::Jiffies => "`bpf_jiffies64` (ticks; the verifier inlines it as a load)",
            Primitive::Call => "BPF-to-BPF call and return",
            Primitive::Rewrite => "IPv4 rewrite: TTL and DSCP/ECN with two incremental checksum updates, both MACs",
            Primitive::CounterAdds => "counting a forwarded packet: 5 adds to the port's block, 2 to the member's",
            Primitive::IngressPort => "the ingress port: `xdp_md.ingress_ifindex` (3 dependent loads, as the verifier rewrites it) and its IFINDEX_SLOTS slot (bounds test, inlined ARRAY lookup, the field)",
            Primitive::FlowKeyStores => "an IPv4 flow key's 13 volatile stores into a per-CPU slot (the pipeline's `store_flow_key`)",
            Primitive::GroupChecks => "a group's and its member's checks: member count in range, hash mode, bank, the bucket's member, position in range, member index, member up, its port and MACs read",
            Primitive::RouteCache => "a route-cache hit: the destination's slot (a multiply), the slot's compare of family, route generation and address, its target's tests (no route, local, kernel)",
            Primitive::Ipv4Checks => "the IPv4 header's fields read once (addresses, TTL, protocol, TOS) and the TTL and options tests (the fragment and checksum tests are the parse's)",
            Primitive::ClassMatch => "one class tried against a packet it does not match (the pipeline's `matches`: the class's match flags, then its DSCP, opcode set, QP range or payload size as it asks), the bench's control class (ACK, CNP) or its CTS class (WRITE_ONLY_IMM up to 64 bytes) against a WRITE_ONLY",
            Primitive::FlowletStep => "a keyed flowlet table's packet inside its flowlet (the pipeline's `FlowletKey::new` and `keyed_step`): the message end of its opcode, the table key built from the flow key, the group's flowlet settings, the decision (generation, member count, the gap since the flow's last packet) and the entry's update in place",
            Primitive::QpEntry => "telemetry's QP entry for a data packet of a QP the table holds (the pipeline's `set_start`, `find` and `data_of_known`): the QP's set (a 64-bit hash of the destination and DestQP), the first way's key compared, the member taken before, the stats' update (packets, bytes, last seen, member, the PSN against the highest seen), the CE and member-sum tests",
            Primitive::EcnQueue => "a packet through its egress port's virtual queue below kmin (the pipeline's `mark_on`): the port's settings read, 3 egress counter adds, the drain since the queue's last packet (a multiply and a shift), depth and high water, the queue's update, the class, profile, threshold and ECT tests",
            Primitive::PaddedFloor => "the floor padded to the qp pipeline's JITed size with code never run (size and placement alone)",
        }
    }

    /// Short name for a budget line.
    pub fn short(self) -> &'static str {
        match self {
            Primitive::Parse => "parse",
            Primitive::HashV2Ipv4 => "hash v2 (IPv4)",
            Primitive::HashV2Ipv6 => "hash v2 (IPv6)",
            Primitive::HashV1 => "hash v1",
            Primitive::Array => "ARRAY lookup",
            Primitive::PerCpuArray => "PERCPU_ARRAY lookup",
            Primitive::LruHash => "LRU_HASH lookup",
            Primitive::Clock => "precise clock",
            Primitive::CoarseClock => "coarse clock",
            Primitive::Jiffies => "jiffies",
            Primitive::Call => "BPF-to-BPF call",
            Primitive::Rewrite => "rewrite",
            Primitive::CounterAdds => "counter adds",
            Primitive::IngressPort => "the ingress port",
            Primitive::FlowKeyStores => "flow key stores",
            Primitive::GroupChecks => "group and member checks",
            Primitive::RouteCache => "route-cache hit",
            Primitive::Ipv4Checks => "IPv4 field reads and tests",
            Primitive::ClassMatch => "class test",
            Primitive::EcnQueue => "ECN virtual queue",
            Primitive::FlowletStep => "flowlet decision and entry update",
            Primitive::QpEntry => "telemetry's QP entry",
            Primitive::PaddedFloor => "padded floor",
        }
    }

    /// Why it cannot go, or what would remove it.
    pub fn why(self) -> &'static str {
        match self {
            Primitive::Parse => "the work itself: every header the decision reads, checked against the packet's end (the verifier demands each bound); a NIC that parses (hardware offload) would take it",
            Primitive::HashV2Ipv4 | Primitive::HashV2Ipv6 | Primitive::HashV1 => "a chain of dependent multiplies and rotates, one step per word; fewer words or a weaker mix would change placement or spread (hash_version 2 is already the family's words only)",
            Primitive::Array => "a bounds check and an address computation the verifier inlines: the least a map access costs; only merging maps (fewer, denser values) removes one",
            Primitive::PerCpuArray => "as an ARRAY lookup plus this CPU's offset; per-CPU so counters and scratch need no atomics",
            Primitive::LruHash => "a kernel helper: jhash of the key, a bucket walk and the LRU reference bit; the keyless table (an ARRAY slot) avoids it",
            Primitive::Clock => "a helper call (its return through the SRSO thunk) into ktime_get_mono_fast_ns: a fenced TSC read and the fast timekeeper's arithmetic; nothing cheaper gives sub-tick time in BPF, and the coarse clock's tick (1-4 ms) is too coarse for flowlet gaps and queue drain; one reading per packet is shared by flowlet and ECN",
            Primitive::CoarseClock => "a helper call reading the last tick's time under a seqcount: mostly the call itself (compare the BPF-to-BPF call)",
            Primitive::Jiffies => "a load of the kernel's tick counter (the verifier inlines the helper): telemetry calls the coarse clock only when it differs from the tick of this CPU's last reading, once a tick, so first and last seen stay CLOCK_MONOTONIC ns for every reader without the call per packet",
            Primitive::Call => "the call and its return through this CPU's return thunk (SRSO mitigation: every return mispredicts); each call is there for the verifier's 512-byte stack limit per call chain",
            Primitive::Rewrite => "the forwarding itself: a router must decrement the TTL and keep the header checksum right (RFC 1624's update, two 16-bit words), and write the next hop's MACs",
            Primitive::CounterAdds => "a load, an add and a store per counter, per-CPU so without atomics; the counters are the switch's accounting (`rocev2 stats`), and the counters-off row of part 1 shows their whole cost",
            Primitive::IngressPort => "XDP gives the ingress port only as `xdp_md.ingress_ifindex`, which the verifier turns into three dependent loads (the xdp_buff's rxq, its device, the device's ifindex), each waiting for the last; the per-port counters need the port's slot, one more lookup on it. Only dropping per-port counting (or a program per port, its slot a constant) would remove it",
            Primitive::FlowKeyStores => "one store per key field (13 for IPv4, three of them zero words): the hash, the flowlet table and telemetry read the key from this CPU's slot, off the 512-byte stack; merged stores would be a memset call, a byte loop on BPF",
            Primitive::GroupChecks => "dependent loads and predicted branches, each a guard a half-published or emptied group needs: without the count test a zero-member group divides by zero, without the up test a drained member gets traffic; the member's port and MACs are what the rewrite writes",
            Primitive::RouteCache => "the cheap side of the longest-prefix match (the route-cache-miss row of part 1 shows the trie walk it saves): a multiply spreads any set of destinations over the 256 slots; a hit must be the same family, the same address (all four words: IPv6 shares the slots) and the current route generation (what makes a route change invalidate every CPU's slots without writing them); the target's three tests send local, kernel-served and unrouted packets to the kernel. Each is a load and a predicted branch on the slot's value, whose first use waits for the lookup; only dropping the cache (a trie walk per packet) would remove it",
            Primitive::Ipv4Checks => "a router's duty (RFC 1812): a packet whose TTL would expire here and one with options go to the kernel, which answers or processes them; each test a compare and a predicted branch on a field read once, the addresses, protocol and TOS the values every later step uses (route, flow key, DSCP)",
            Primitive::ClassMatch => "the classes are the operator's: the first that matches gives the packet its DSCP, priority and ECN treatment, so a packet tries them in order until one does, and one no class takes (the bench's WRITE_ONLY) tries them all; each is a load of its flags and, for the opcode set, a load of the set's word and a bit test, each a predicted branch. Fewer classes, or the busiest first, are what shortens it",
            Primitive::FlowletStep => "the flowlet's state is the feature: the table's key is the flow key's 11 words copied next to the group (a load and a store each; the LRU_HASH lookup hashes and compares it in place), and a kept flowlet must still check that its member is the group's current one (generation, member count) and that the flow was not idle past the gap, then write the packet's time back for the next one (the entry's fields, one aligned store each, so a CPU racing on the flow never sees a torn position)",
            Primitive::QpEntry => "the per-QP table is the feature: an array, so a QP's place is a hash of its key (three 64-bit multiplies and a finaliser, about 25 instructions where a hash map's jhash and bucket walk would be a helper call), and the key in the slot must be compared in full (family, DestQP, four address words) since sets are shared; the update is the counters `rocev2 qp` shows (packets, bytes, last seen, member changes) and the PSN test that finds losses upstream (ahead of the highest PSN) and resends (behind it), all in the slot's first cache line",
            Primitive::EcnQueue => "the queue's state is the feature: its depth must be drained by the time since its last packet and written back for the next one (a load, a multiply, a shift, a subtract and a store per field, the drain's 64-bit multiply instead of six divisions), and each test (exempt class, profile, kmin and kmax, ECT) is a load and a branch a packet between the thresholds or of another class needs; the egress counters are `rocev2 stats`' per-port ECN accounting (per-CPU: no atomics)",
            Primitive::PaddedFloor => "not on any path: it shows what a program's size and place cost by themselves",
        }
    }
}

/// Measured ns per operation of each primitive.
#[derive(Clone, Debug, Default)]
pub struct Floors(pub BTreeMap<Primitive, f64>);

impl Floors {
    /// ns of one operation; NaN if not measured.
    pub fn ns(&self, p: Primitive) -> f64 {
        self.0.get(&p).copied().unwrap_or(f64::NAN)
    }
}

/// One primitive on a packet's path, and what it is there for (a map's
/// name as the maps table spells it, a helper, a function).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub primitive: Primitive,
    pub what: &'static str,
    /// The map the step looks up, if it is a lookup.
    pub map: Option<&'static str>,
}

const fn lookup(primitive: Primitive, map: &'static str) -> Step {
    Step { primitive, what: map, map: Some(map) }
}

const fn step(primitive: Primitive, what: &'static str) -> Step {
    Step { primitive, what, map: None }
}

use Primitive::{
    Array, Call, ClassMatch, Clock, CounterAdds, EcnQueue, FlowKeyStores, FlowletStep, GroupChecks, IngressPort,
    Ipv4Checks, Jiffies, LruHash, Parse, PerCpuArray, QpEntry, Rewrite, RouteCache,
};

/// `a` then `b`, in a constant (paths share their first steps).
const fn then<const A: usize, const B: usize, const N: usize>(a: [Step; A], b: [Step; B]) -> [Step; N] {
    assert!(A + B == N, "N must be A + B");
    let mut out = [step(Parse, ""); N];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    while i < N {
        out[i] = b[i - A];
        i += 1;
    }
    out
}

/// The ingress port's IFINDEX_SLOTS slot, found with the port (the
/// lookup is part of that primitive).
const INGRESS: Step =
    Step { primitive: IngressPort, what: "ingress_ifindex and its IFINDEX_SLOTS slot", map: Some("IFINDEX_SLOTS") };

/// Every IPv4 packet's path to its group: the ingress port, the parse,
/// the family's function, the header's tests, the route cache (a hit),
/// the flow key, the group.
const TO_THE_GROUP: [Step; 10] = [
    INGRESS,
    step(Parse, "parse_l2, parse_ipv4 + checksum, parse_l4 (UDP, BTH)"),
    step(Call, "forward_v4_call (the IPv4 function)"),
    step(Ipv4Checks, "forward_v4's header fields, TTL and options tests"),
    lookup(Array, "CONFIG"),
    lookup(PerCpuArray, "ROUTE_CACHE"),
    step(RouteCache, "ROUTE_CACHE's slot, compare and target"),
    lookup(PerCpuArray, "FLOW_KEY"),
    step(FlowKeyStores, "FLOW_KEY's fields"),
    lookup(Array, "GROUPS"),
];

/// The qp (and five-tuple: the same path) IPv4 packet with a route-cache
/// hit, from the program's entry to the redirect (which the floor pays).
pub const QP_PATH: &[Step] = &then::<10, 9, 19>(
    TO_THE_GROUP,
    [
        lookup(Array, "CONFIG"),
        step(Primitive::HashV2Ipv4, "member hash"),
        lookup(Array, "BUCKETS"),
        lookup(Array, "MEMBERS"),
        step(GroupChecks, "GroupEntry, bucket and MemberEntry"),
        step(Rewrite, "TTL, DSCP/ECN, checksum, MACs"),
        lookup(PerCpuArray, "PORT_COUNTERS"),
        lookup(PerCpuArray, "MEMBER_STATS"),
        step(CounterAdds, "port and member counters"),
    ],
);

/// The keyed flowlet pipeline's IPv4 packet inside a flowlet (the entry
/// found and kept): no member hash and no bucket table (the flow's entry
/// names the member), the clock and the flowlet table instead.
pub const FLOWLET_PATH: &[Step] = &then::<10, 12, 22>(
    TO_THE_GROUP,
    [
        step(Clock, "the packet's clock reading (flowlet gap, shared with ECN)"),
        lookup(Array, "CONFIG"),
        step(Call, "flowlet_position (keyed table)"),
        lookup(PerCpuArray, "FLOWLET_SCRATCH"),
        lookup(LruHash, "FLOWLETS"),
        step(FlowletStep, "the table key, the decision and the entry's update (keyed_step), ends_message"),
        lookup(Array, "MEMBERS"),
        step(GroupChecks, "GroupEntry and MemberEntry"),
        step(Rewrite, "TTL, DSCP/ECN, checksum, MACs"),
        lookup(PerCpuArray, "PORT_COUNTERS"),
        lookup(PerCpuArray, "MEMBER_STATS"),
        step(CounterAdds, "port and member counters"),
    ],
);

/// What the full pipeline adds to [`FLOWLET_PATH`]: two classes tried
/// (neither matches the bench's WRITE_ONLY) and the egress port's virtual
/// queue, on the flowlet stage's clock reading.
pub const CLASSES_ECN_STEPS: &[Step] = &[
    lookup(Array, "CONFIG"),
    step(Call, "classify_index"),
    lookup(Array, "CLASSES"),
    step(ClassMatch, "class 0: control (opcode set)"),
    lookup(Array, "CLASSES"),
    step(ClassMatch, "class 1: CTS (opcode set, payload)"),
    lookup(Array, "IFINDEX_SLOTS"),
    lookup(Array, "EGRESS_BY_SLOT"),
    step(Call, "mark_code"),
    lookup(PerCpuArray, "EGRESS_COUNTERS"),
    lookup(Array, "VQUEUES"),
    lookup(Array, "ECN_PROFILES"),
    step(EcnQueue, "mark_on: drain, depth, update, thresholds, egress counters"),
];

/// What an ECN virtual queue adds to the qp path (its own clock reading:
/// a hashed group takes none).
pub const ECN_STEPS: &[Step] = &[
    lookup(Array, "IFINDEX_SLOTS"),
    lookup(Array, "EGRESS_BY_SLOT"),
    step(Call, "mark_code"),
    lookup(PerCpuArray, "EGRESS_COUNTERS"),
    lookup(Array, "VQUEUES"),
    step(Clock, "the packet's clock reading (queue drain)"),
    lookup(Array, "ECN_PROFILES"),
    step(EcnQueue, "mark_on: drain, depth, update, thresholds, egress counters"),
];

/// What every feature loaded but unused adds to the qp path: the tests
/// that find each one unused (a pinned-policy test, an empty class table,
/// a port without a virtual queue), each a lookup.
pub const UNUSED_STEPS: &[Step] = &[lookup(Array, "GROUPS"), lookup(Array, "CONFIG"), lookup(Array, "IFINDEX_SLOTS")];

/// What per-QP telemetry adds for a data packet of a QP already in the
/// table (found in its set's first way, in order, not marked). Nothing is
/// parsed again: the flow key is the pipeline's, the BTH's place its
/// parse's (the PSN's load and bounds check are in the remainder); no
/// call: `observe` is inlined into the family functions.
pub const TELEMETRY_STEPS: &[Step] = &[
    lookup(PerCpuArray, "FLOW_KEY"),
    lookup(PerCpuArray, "TELEMETRY_SCRATCH"),
    lookup(Array, "TRACE_FILTER"),
    step(Jiffies, "last seen: the tick, against this CPU's last coarse clock reading (the call once a tick)"),
    lookup(Array, "QP_TELEMETRY"),
    step(QpEntry, "the QP's set hash, its first way's compare, the entry's update"),
];

/// One primitive's share of a row.
#[derive(Clone, Debug, PartialEq)]
pub struct Part {
    pub primitive: Primitive,
    pub count: u32,
    pub each_ns: f64,
    pub ns: f64,
    /// The steps' `what`, in path order, duplicates kept.
    pub whats: Vec<&'static str>,
}

/// A row's cost split into its primitives and the remainder.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    pub cost: f64,
    pub parts: Vec<Part>,
    pub accounted: f64,
    pub remainder: f64,
}

/// Splits `cost` ns by the primitives of `steps` (counted per primitive,
/// each times its measured floor); the remainder is what they leave.
pub fn split(cost: f64, steps: &[Step], floors: &Floors) -> Split {
    let mut by: BTreeMap<Primitive, Vec<&'static str>> = BTreeMap::new();
    for s in steps {
        by.entry(s.primitive).or_default().push(s.what);
    }
    let parts: Vec<Part> = by
        .into_iter()
        .map(|(primitive, whats)| {
            let each_ns = floors.ns(primitive);
            let count = whats.len() as u32;
            Part { primitive, count, each_ns, ns: f64::from(count) * each_ns, whats }
        })
        .collect();
    let accounted = parts.iter().map(|p| p.ns).sum::<f64>();
    Split { cost, parts, accounted, remainder: cost - accounted }
}

/// `names` with repeats folded: "CONFIG x2, GROUPS".
fn folded(names: &[&str]) -> String {
    let mut out: Vec<(String, usize)> = Vec::new();
    for n in names {
        match out.iter_mut().find(|(m, _)| m == n) {
            Some((_, c)) => *c += 1,
            None => out.push(((*n).to_owned(), 1)),
        }
    }
    out.iter().map(|(n, c)| if *c > 1 { format!("{n} x{c}") } else { n.clone() }).collect::<Vec<_>>().join(", ")
}

/// A budget table in Markdown: one line per primitive, then the sum and
/// the remainder. `against` says what the cost is read against.
pub fn render(title: &str, against: &str, goal: f64, s: &Split, remainder_note: &str) -> String {
    let mut md = format!(
        "#### {title}: {:+.1} ns above {against} (goal <= +{goal:.0} ns)\n\n| part | count | ns each (measured) | ns | on the path | why it stays (or what would remove it) |\n|---|---|---|---|---|---|\n",
        s.cost
    );
    for p in &s.parts {
        md.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {} | {} |\n",
            p.primitive.short(),
            p.count,
            p.each_ns,
            p.ns,
            folded(&p.whats),
            p.primitive.why()
        ));
    }
    md.push_str(&format!(
        "| accounted for by measured floors | | | {:.1} | {:.0}% of the cost | |\n| remainder | | | {:.1} | | {remainder_note} |\n\n",
        s.accounted,
        if s.cost > 0.0 { 100.0 * s.accounted / s.cost } else { 0.0 },
        s.remainder
    ));
    md
}

/// What a verified program holds, as its xlated instructions show it:
/// references to each map (by the maps table's name), BPF-to-BPF calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StaticCounts {
    pub map_refs: BTreeMap<String, u32>,
    pub calls: u32,
}

impl StaticCounts {
    /// Counts in xlated instructions (8 bytes each, as the kernel dumps
    /// them: a map reference is a 64-bit immediate load whose source
    /// register is BPF_PSEUDO_MAP_FD (1) or BPF_PSEUDO_MAP_VALUE (2) and
    /// whose immediate is the map id; a BPF-to-BPF call is a call whose
    /// source register is BPF_PSEUDO_CALL (1)). `name_of` names a map id.
    pub fn of_xlated(insns: &[[u8; 8]], name_of: impl Fn(u32) -> Option<String>) -> Self {
        let mut counts = StaticCounts::default();
        let mut i = 0;
        while i < insns.len() {
            let insn = insns[i];
            let (code, src) = (insn[0], insn[1] >> 4);
            let imm = u32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
            if code == 0x18 {
                if src == 1 || src == 2 {
                    if let Some(name) = name_of(imm) {
                        *counts.map_refs.entry(name).or_default() += 1;
                    }
                }
                i += 2;
                continue;
            }
            if code == 0x85 && src == 1 {
                counts.calls += 1;
            }
            i += 1;
        }
        counts
    }
}

/// Checks a path against its row's verified program: every map the path
/// looks up is referenced at least as often, and the program has at least
/// as many BPF-to-BPF calls as the path makes.
pub fn check_path(row: &str, steps: &[Step], counts: &StaticCounts) -> Result<()> {
    let mut wanted: BTreeMap<&str, u32> = BTreeMap::new();
    for s in steps {
        if let Some(m) = s.map {
            *wanted.entry(m).or_default() += 1;
        }
    }
    for (map, n) in wanted {
        let have = counts.map_refs.get(map).copied().unwrap_or(0);
        if have < n {
            bail!("budget of {row}: the path looks {map} up {n} times, the verified program references it {have} times (the path list in bench/budget.rs is out of date)");
        }
    }
    let calls = steps.iter().filter(|s| s.primitive == Primitive::Call).count() as u32;
    if counts.calls < calls {
        bail!(
            "budget of {row}: the path makes {calls} BPF-to-BPF calls, the verified program has {} (the path list in bench/budget.rs is out of date)",
            counts.calls
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn floors() -> Floors {
        Floors(BTreeMap::from([
            (Primitive::Array, 2.0),
            (Primitive::PerCpuArray, 3.0),
            (Primitive::Call, 5.0),
            (Primitive::Parse, 20.0),
            (Primitive::HashV2Ipv4, 8.0),
            (Primitive::Clock, 15.0),
            (Primitive::LruHash, 25.0),
            (Primitive::CoarseClock, 4.0),
            (Primitive::Rewrite, 6.0),
            (Primitive::CounterAdds, 3.0),
            (Primitive::IngressPort, 4.0),
            (Primitive::FlowKeyStores, 2.0),
            (Primitive::GroupChecks, 3.0),
            (Primitive::RouteCache, 1.5),
            (Primitive::Ipv4Checks, 1.0),
            (Primitive::ClassMatch, 0.5),
            (Primitive::EcnQueue, 7.0),
            (Primitive::FlowletStep, 5.0),
            (Primitive::QpEntry, 9.0),
            (Primitive::Jiffies, 0.5),
        ]))
    }

    #[test]
    fn qp_split_counts_each_primitive_once_per_step() {
        let s = split(100.0, QP_PATH, &floors());
        let count = |p| s.parts.iter().find(|x| x.primitive == p).map_or(0, |x| x.count);
        assert_eq!(count(Primitive::Array), 5, "IFINDEX_SLOTS is the ingress port's");
        assert_eq!(count(Primitive::PerCpuArray), 4);
        assert_eq!(count(Primitive::Call), 1, "one BPF-to-BPF call on the hashed path");
        assert_eq!(count(Primitive::Parse), 1);
        assert_eq!(count(Primitive::HashV2Ipv4), 1);
        assert_eq!(count(Primitive::Rewrite), 1);
        assert_eq!(count(Primitive::CounterAdds), 1);
        assert_eq!(count(Primitive::IngressPort), 1);
        assert_eq!(count(Primitive::FlowKeyStores), 1);
        assert_eq!(count(Primitive::GroupChecks), 1);
        assert_eq!(count(Primitive::RouteCache), 1, "one route-cache hit");
        assert_eq!(count(Primitive::Ipv4Checks), 1);
        // 5x2 + 4x3 + 1x5 + 20 + 8 + 6 + 3 + 4 + 2 + 3 + 1.5 + 1 = 75.5
        assert_eq!(s.accounted, 75.5);
        assert_eq!(s.remainder, 24.5);
        let array = s.parts.iter().find(|x| x.primitive == Primitive::Array).unwrap();
        assert_eq!(array.ns, 10.0);
        assert_eq!(folded(&array.whats), "CONFIG x2, GROUPS, BUCKETS, MEMBERS");
        let ingress = s.parts.iter().find(|x| x.primitive == Primitive::IngressPort).unwrap();
        assert_eq!(folded(&ingress.whats), "ingress_ifindex and its IFINDEX_SLOTS slot");
    }

    #[test]
    fn a_cost_below_its_floors_leaves_a_negative_remainder() {
        let s = split(10.0, UNUSED_STEPS, &floors());
        assert_eq!(s.accounted, 6.0);
        assert_eq!(s.remainder, 4.0);
        let s = split(3.0, UNUSED_STEPS, &floors());
        assert_eq!(s.remainder, -3.0);
    }

    #[test]
    fn the_qp_and_flowlet_paths_share_their_way_to_the_group() {
        assert_eq!(QP_PATH[..TO_THE_GROUP.len()], TO_THE_GROUP);
        assert_eq!(FLOWLET_PATH[..TO_THE_GROUP.len()], TO_THE_GROUP);
        assert_eq!(QP_PATH.last().map(|s| s.primitive), Some(CounterAdds));
    }

    #[test]
    fn full_pipeline_adds_classes_and_ecn_to_the_flowlet_path() {
        let full: Vec<Step> = FLOWLET_PATH.iter().chain(CLASSES_ECN_STEPS).copied().collect();
        let s = split(200.0, &full, &floors());
        let count = |p| s.parts.iter().find(|x| x.primitive == p).map_or(0, |x| x.count);
        assert_eq!(count(Primitive::Call), 4);
        assert_eq!(count(Primitive::Clock), 1, "one clock reading shared by flowlet and ECN");
        assert_eq!(count(Primitive::LruHash), 1);
        assert_eq!(count(Primitive::EcnQueue), 1, "the virtual queue once, in mark_on");
        assert_eq!(count(Primitive::RouteCache), 1);
        assert_eq!(count(Primitive::Ipv4Checks), 1);
        assert_eq!(count(Primitive::ClassMatch), 2, "both of the bench's classes tried");
        assert_eq!(count(Primitive::FlowletStep), 1, "the flowlet decision once, in flowlet_position");
        // Array 4+7=11 x2, PerCpu 5+1=6 x3, Call 4x5, Parse 20, Clock 15, LruHash 25, Rewrite 6,
        // CounterAdds 3, IngressPort 4, FlowKeyStores 2, GroupChecks 3, RouteCache 1.5, Ipv4Checks 1,
        // ClassMatch 2x0.5, EcnQueue 7, FlowletStep 5
        assert_eq!(
            s.accounted,
            22.0 + 18.0 + 20.0 + 20.0 + 15.0 + 25.0 + 6.0 + 3.0 + 4.0 + 2.0 + 3.0 + 1.5 + 1.0 + 1.0 + 7.0 + 5.0
        );
    }

    #[test]
    fn the_ecn_marginal_takes_its_clock_and_its_queue_once() {
        let s = split(50.0, ECN_STEPS, &floors());
        let count = |p| s.parts.iter().find(|x| x.primitive == p).map_or(0, |x| x.count);
        assert_eq!((count(EcnQueue), count(Clock), count(Call)), (1, 1, 1));
        // Array 4 x2, PerCpu 1 x3, Call 5, Clock 15, EcnQueue 7
        assert_eq!(s.accounted, 8.0 + 3.0 + 5.0 + 15.0 + 7.0);
        assert_eq!(s.remainder, 12.0);
    }

    #[test]
    fn telemetry_takes_its_qp_entry_once() {
        let s = split(40.0, TELEMETRY_STEPS, &floors());
        let count = |p| s.parts.iter().find(|x| x.primitive == p).map_or(0, |x| x.count);
        assert_eq!((count(QpEntry), count(Jiffies), count(Call)), (1, 1, 0));
        // Array 2 x2, PerCpu 2 x3, Jiffies 0.5, QpEntry 9
        assert_eq!(s.accounted, 4.0 + 6.0 + 0.5 + 9.0);
    }

    #[test]
    fn xlated_counts_see_map_references_and_pseudo_calls() {
        let ld_map = |id: u32| {
            let mut a = [0x18, 0x11, 0, 0, 0, 0, 0, 0];
            a[4..8].copy_from_slice(&id.to_le_bytes());
            [a, [0; 8]]
        };
        let mut insns = Vec::new();
        insns.extend(ld_map(7));
        insns.extend(ld_map(7));
        insns.extend(ld_map(9));
        insns.push([0x85, 0x10, 0, 0, 3, 0, 0, 0]); // pseudo call
        insns.push([0x85, 0x00, 0, 0, 1, 0, 0, 0]); // helper call
        insns.push([0x18, 0x01, 0, 0, 5, 0, 0, 0]); // a plain 64-bit constant
        insns.push([0, 0, 0, 0, 0, 0, 0, 0]);
        let names = |id| match id {
            7 => Some("CONFIG".to_owned()),
            9 => Some("GROUPS".to_owned()),
            _ => None,
        };
        let c = StaticCounts::of_xlated(&insns, names);
        assert_eq!(c.map_refs.get("CONFIG"), Some(&2));
        assert_eq!(c.map_refs.get("GROUPS"), Some(&1));
        assert_eq!(c.calls, 1);
        let path = [lookup(Array, "CONFIG"), lookup(Array, "CONFIG"), step(Call, "f")];
        assert!(check_path("t", &path, &c).is_ok());
        let path = [lookup(Array, "CONFIG"), lookup(Array, "GROUPS"), lookup(Array, "GROUPS")];
        assert!(check_path("t", &path, &c).unwrap_err().to_string().contains("GROUPS up 2 times"));
    }
}
