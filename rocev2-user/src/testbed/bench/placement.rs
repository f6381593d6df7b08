//! A budget's remainder placed on source lines: the line profile of the
//! budget row's own program (profile.rs), each profiled line filed under a
//! part of the budget ([`Place`]): a primitive the budget already counts
//! (parse, hash, map lookups, the clocks, calls, the route cache's hit...),
//! a step of the remainder (what has no primitive of its own: the feature
//! tests, the entry and exit...), or the floor's own
//! redirect. A marginal row's lines are its profile's minus the profile of
//! the row it is read against.
//!
//! A line's profiled ns per packet is its samples times perf's sampling
//! period (100 µs of CPU time) over the packets the loop ran meanwhile.
//! The profile's total drifts with the machine's load and is inflated by
//! the sampling itself, so each profile is scaled: its lines (the
//! redirect, which the floor pays, apart) are multiplied by one factor so
//! that they sum to the row's cost above the floor measured in part 1. The
//! factor, the redirect and harness the scale leaves out, the samples on
//! no line and the sampling error are printed beside the table; for a
//! marginal row, its measured cost minus the two rows' costs above the
//! floor is the part no line is given.

use std::{collections::BTreeMap, fmt::Write as _};

use rocev2_common::features::Features;

use super::{
    budget::{Floors, Primitive, Split},
    profile::{Detail, LineCost, Profile},
};

/// The eBPF sources the forwarding program is built from: line info names
/// a file and a line, and the function around the line says which step it
/// is (checksum.rs's `fold` checks a header, its `update_u16` rewrites one).
const SOURCES: &[(&str, &str)] = &[
    ("rocev2-ebpf/src/args.rs", include_str!("../../../../rocev2-ebpf/src/args.rs")),
    ("rocev2-ebpf/src/class.rs", include_str!("../../../../rocev2-ebpf/src/class.rs")),
    ("rocev2-ebpf/src/counters.rs", include_str!("../../../../rocev2-ebpf/src/counters.rs")),
    ("rocev2-ebpf/src/ctx.rs", include_str!("../../../../rocev2-ebpf/src/ctx.rs")),
    ("rocev2-ebpf/src/ecn.rs", include_str!("../../../../rocev2-ebpf/src/ecn.rs")),
    ("rocev2-ebpf/src/features.rs", include_str!("../../../../rocev2-ebpf/src/features.rs")),
    ("rocev2-ebpf/src/forward.rs", include_str!("../../../../rocev2-ebpf/src/forward.rs")),
    ("rocev2-ebpf/src/forwarded.rs", include_str!("../../../../rocev2-ebpf/src/forwarded.rs")),
    ("rocev2-ebpf/src/main.rs", include_str!("../../../../rocev2-ebpf/src/main.rs")),
    ("rocev2-ebpf/src/maps.rs", include_str!("../../../../rocev2-ebpf/src/maps.rs")),
    ("rocev2-ebpf/src/parse.rs", include_str!("../../../../rocev2-ebpf/src/parse.rs")),
    ("rocev2-ebpf/src/pin.rs", include_str!("../../../../rocev2-ebpf/src/pin.rs")),
    ("rocev2-ebpf/src/redirect.rs", include_str!("../../../../rocev2-ebpf/src/redirect.rs")),
    ("rocev2-ebpf/src/rewrite.rs", include_str!("../../../../rocev2-ebpf/src/rewrite.rs")),
    ("rocev2-ebpf/src/route.rs", include_str!("../../../../rocev2-ebpf/src/route.rs")),
    ("rocev2-ebpf/src/select.rs", include_str!("../../../../rocev2-ebpf/src/select.rs")),
    ("rocev2-ebpf/src/telemetry.rs", include_str!("../../../../rocev2-ebpf/src/telemetry.rs")),
    ("rocev2-ebpf/src/transport.rs", include_str!("../../../../rocev2-ebpf/src/transport.rs")),
    ("rocev2-common/src/arrival.rs", include_str!("../../../../rocev2-common/src/arrival.rs")),
    ("rocev2-common/src/bth.rs", include_str!("../../../../rocev2-common/src/bth.rs")),
    ("rocev2-common/src/buckets.rs", include_str!("../../../../rocev2-common/src/buckets.rs")),
    ("rocev2-common/src/checksum.rs", include_str!("../../../../rocev2-common/src/checksum.rs")),
    ("rocev2-common/src/class.rs", include_str!("../../../../rocev2-common/src/class.rs")),
    ("rocev2-common/src/counters.rs", include_str!("../../../../rocev2-common/src/counters.rs")),
    ("rocev2-common/src/ecn.rs", include_str!("../../../../rocev2-common/src/ecn.rs")),
    ("rocev2-common/src/features.rs", include_str!("../../../../rocev2-common/src/features.rs")),
    ("rocev2-common/src/flowlet.rs", include_str!("../../../../rocev2-common/src/flowlet.rs")),
    ("rocev2-common/src/hash.rs", include_str!("../../../../rocev2-common/src/hash.rs")),
    ("rocev2-common/src/maps.rs", include_str!("../../../../rocev2-common/src/maps.rs")),
    ("rocev2-common/src/telemetry.rs", include_str!("../../../../rocev2-common/src/telemetry.rs")),
];

/// The name of the function a source line declares (`pub(crate) const fn
/// x<T>(...)` gives `x`), if it declares one.
fn declared_fn(line: &str) -> Option<&str> {
    let mut t = line.trim_start();
    loop {
        let before = t;
        for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "unsafe ", "async ", "extern \"C\" "] {
            t = t.strip_prefix(prefix).unwrap_or(t);
        }
        if t == before {
            break;
        }
    }
    let rest = t.strip_prefix("fn ")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
    (end > 0).then(|| &rest[..end])
}

/// The function source line `line` (1-based) of `source` is in: the
/// nearest declaration at or above it.
pub fn function_in(source: &str, line: u32) -> Option<&str> {
    let lines: Vec<&str> = source.lines().take(line as usize).collect();
    lines.iter().rev().find_map(|l| declared_fn(l))
}

/// The function around `file:line` (`rocev2-ebpf/src/parse.rs:83`) in the
/// sources built into this binary.
pub fn function_at(location: &str) -> Option<&'static str> {
    let (file, line) = location.rsplit_once(':')?;
    let source = SOURCES.iter().find(|(f, _)| *f == file)?.1;
    function_in(source, line.parse().ok()?)
}

/// Where a profiled line's time goes in a budget. The first group are the
/// primitives the budget counts at their measured floors; then the steps
/// of the remainder; then the floor's own work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Place {
    Parse,
    Hash,
    Lookup,
    LruHash,
    Clock,
    CoarseClock,
    Call,
    Entry,
    IngressPort,
    RouteCache,
    Checks,
    FlowKey,
    MemberChoice,
    Flowlet,
    Classes,
    Ecn,
    Rewrite,
    Counters,
    Features,
    Telemetry,
    Other,
    /// The program's first line record (its prologue and first
    /// instructions): where the entry after the test-run harness stalls,
    /// as it does on the floor's first instructions.
    FirstLine,
    Redirect,
}

impl Place {
    /// The budget's primitives this part is (none: a step of the remainder).
    pub fn primitives(self) -> &'static [Primitive] {
        match self {
            Place::Parse => &[Primitive::Parse],
            Place::Hash => &[Primitive::HashV2Ipv4, Primitive::HashV2Ipv6, Primitive::HashV1],
            Place::Lookup => &[Primitive::Array, Primitive::PerCpuArray],
            Place::LruHash => &[Primitive::LruHash],
            Place::Clock => &[Primitive::Clock],
            Place::CoarseClock => &[Primitive::CoarseClock, Primitive::Jiffies],
            Place::Call => &[Primitive::Call],
            Place::Rewrite => &[Primitive::Rewrite],
            Place::Counters => &[Primitive::CounterAdds],
            Place::IngressPort => &[Primitive::IngressPort],
            Place::FlowKey => &[Primitive::FlowKeyStores],
            Place::MemberChoice => &[Primitive::GroupChecks],
            Place::RouteCache => &[Primitive::RouteCache],
            Place::Checks => &[Primitive::Ipv4Checks],
            Place::Classes => &[Primitive::ClassMatch],
            Place::Ecn => &[Primitive::EcnQueue],
            Place::Flowlet => &[Primitive::FlowletStep],
            Place::Telemetry => &[Primitive::QpEntry],
            _ => &[],
        }
    }

    /// Whether `split`'s budget counts this part by primitives.
    pub fn is_budgeted(self, split: &Split) -> bool {
        split.parts.iter().any(|x| self.primitives().contains(&x.primitive))
    }

    pub fn title(self) -> &'static str {
        match self {
            Place::Parse => "parse",
            Place::Hash => "member hash",
            Place::Lookup => "ARRAY and PERCPU_ARRAY lookups (inlined)",
            Place::LruHash => "LRU_HASH lookup",
            Place::Clock => "precise clock",
            Place::CoarseClock => "coarse clock (and jiffies)",
            Place::Call => "BPF-to-BPF calls (entry and return)",
            Place::Entry => "entry and exit",
            Place::IngressPort => "the ingress port",
            Place::RouteCache => "route cache",
            Place::Checks => "IPv4 field reads and tests",
            Place::FlowKey => "flow key stores",
            Place::MemberChoice => "group and member checks",
            Place::Flowlet => "flowlet decision and entry update",
            Place::Classes => "class matching",
            Place::Ecn => "ECN virtual queue",
            Place::Rewrite => "rewrite",
            Place::Counters => "counter adds",
            Place::Features => "feature tests",
            Place::Telemetry => "telemetry's QP entry",
            Place::Other => "other lines",
            Place::FirstLine => "the program's first instructions",
            Place::Redirect => "the redirect, beyond the compared program's",
        }
    }

    /// Why a row read against the floor has lines of a primitive its
    /// budget's path does not take.
    pub fn off_path_why(self) -> &'static str {
        match self {
            Place::Hash => OFF_PATH_HASH,
            Place::Ecn => OFF_PATH_ECN,
            Place::Classes => OFF_PATH_CLASSES,
            Place::Flowlet => OFF_PATH_FLOWLET,
            Place::Telemetry => OFF_PATH_TELEMETRY,
            _ => "not on this row's budget path (bench/budget.rs), yet its lines ran in the row's program: the path list may be missing a step (compare the profile's lines)",
        }
    }

    /// Why a step stays (a primitive's reason is its budget line's).
    pub fn why(self) -> &'static str {
        match self {
            Place::Entry => "the program's glue around its work: the IPv4 function's result handed back as a code and a forwarded packet's record for the counters and telemetry (its skb priority, from the class's action, is class.rs's `priority`), the choice between the direct and the hashed devmap, the XDP action, the calls' argument moves; the redirect and the program's first line are left out of the scale (the floor pays them)",
            Place::IngressPort => "a primitive (the table above): the context field's three dependent loads, the slot's bounds test, lookup and field; where the first use of the port stalls lands on the line that uses it",
            Place::RouteCache => "a primitive (the table above): the destination's slot in the per-CPU route cache (a multiply), the compare of family, route generation and address, the target's tests; the stall on the slot's first use (it waits for the ROUTE_CACHE lookup) and the generation's (CONFIG's) lands on these lines, not on the lookups'",
            Place::Checks => "a primitive (the table above): the IPv4 header's fields read once and kept (spilled across the route's lookups) for the steps after, the TTL and options tests, the branches on the fragment and checksum tests (whose work is the parse's), and the TTL's decrement and the DSCP's shift, which land on `forward_v4`'s lines but are the rewrite's work (its primitive counts them)",
            Place::FlowKey => "a primitive (the table above): the key's volatile stores, and the address words' byte swaps before them",
            Place::MemberChoice => "a primitive (the table above): the group's and member's loads and tests, the bucket's read, the member's fields; the stall on the GROUPS, BUCKETS and MEMBERS values' first use lands on these lines, not on the lookups'",
            Place::Flowlet => "a primitive (the table above): the flowlet table's key built from the flow key (`FlowletKey::new`), the decision (generation, member count, the gap since the flow's last packet, message end) and the entry's update in place, field by field (`keyed_step`), and the flowlet function's own moves around them (`flowlet_position`); the key's loads read the flow key the pipeline has just stored, and the stall on the FLOWLETS entry's first use (after the LRU_HASH lookup) lands on these lines",
            Place::Classes => "a primitive (the table above), once per class tried (the classes this row configures never match the bench's WRITE_ONLY, so every one is): each class's tests, the class loop around them (the live count, the index, the lookup's result), the packet's fields for them, the no-match result's action and the DSCP's (`apply_dscp`)",
            Place::Ecn => "a primitive (the table above): the marker's lines (`mark_on`: the egress counters, the drain since the queue's last packet, depth, its update, the thresholds), the egress entry's lookups' own lines (`egress_entry`), the call's argument moves (`mark_forwarded`, `mark_code`, `new_tos`) and, between the thresholds, the random draw; the stall on the first use of the EGRESS_BY_SLOT and VQUEUES values (the port's settings copied, the queue read) lands on these lines, not on the lookups', where the primitive, its values found once, has none",
            Place::Rewrite => "the forwarding's own stores: TTL, the DSCP/ECN byte, two incremental checksum updates (RFC 1624) and both MACs",
            Place::Counters => "the port's per-CPU counter block (packets and bytes received and forwarded, RoCE) and the member's packets and bytes: an add each, a load and a store; per-CPU, so no atomics (the counters-off row of part 1 is what they cost)",
            Place::Features => "the load-time feature tests (`enabled()`: a frozen global's load and a branch) and, for a feature loaded but unused, the test that finds it unused",
            Place::Telemetry => "a primitive (the table above): the QP's set hash, its ways' compare and the entry's update (`set_start`, `find`, `data_of_known`: PSN step, packet and byte counts, member check), and around them the rest of `observe`'s path: the PSN's read from the BTH the parse found, the trace filter's test, the tick's compare for the coarse clock; the stall on the QP_TELEMETRY slot's first use (the key compare in `find`, after its lookup) lands on these lines",
            Place::Other => "lines no rule of bench/placement.rs names (the lines say where)",
            Place::FirstLine => "where the entry after the test-run harness stalls, on whatever the program's first instructions are: the floor pays it on its own",
            Place::Redirect => "the devmap redirect, which the floor pays too: what is left is the difference between two profiles of the same work",
            Place::Call => "a primitive (the table above): the callee's prologue and the instruction the return comes back to (where its misprediction stalls); the call's argument moves are the caller's",
            Place::Lookup => "a primitive (the table above): the inlined lookup's instructions; the first use of the value it finds lands on the line that reads it",
            _ => "a primitive: see its row in the table above",
        }
    }
}

/// Why hash.rs's lines show in a row whose packet takes no member hash
/// (a flowlet packet inside its flowlet: the group's policy branch jumps
/// past the hash, see the built object's `llvm-objdump -d -l`).
const OFF_PATH_HASH: &str = "not on this row's path (its group's policy branch jumps past the member hash): its `mix` lines are instructions of other steps with no line of their own (LLVM gives a block's entry moves none), which BTF line info files under the record before them in address order; once the verifier has removed the code of features not loaded, that can be a removed block's last line (the kernel's `bpf_adj_linfo_after_remove` hands it to the first live instruction)";

/// Why class.rs's lines show in a row whose packet tries no class.
const OFF_PATH_CLASSES: &str = "no class is tried on this row's path (classes not loaded, or loaded with an empty table): the lines are `matched`'s read of the live count and the test that finds it 0, the TOS passed through `apply_dscp` with no class's action, or instructions filed under the line record of code the verifier removed";

/// Why ECN lines show in a row loaded without the ECN feature (the
/// verifier removed the marker).
const OFF_PATH_ECN: &str = "not on this row's path (the ECN feature is not loaded: the verifier removed the marker and its call): `new_tos`'s lines are its `enabled()` test and the class's DSCP, and `mark_forwarded` lines are live instructions filed under a removed block's last line record (the kernel's `bpf_adj_linfo_after_remove` hands it to the first live instruction after the block)";

/// Why ECN lines show in a marginal row that loads the ECN feature (the
/// other row does not) and configures no virtual queue.
const LOADED_UNUSED_ECN: &str = "loaded but unused (this row loads the ECN feature, the row it is read against does not, and the packet's egress port has no virtual queue): `egress_entry`'s read of the port's IFINDEX_SLOTS slot (the lookup is the budget's) and the test that finds no queue, after which the TOS goes on unchanged";

/// Why flowlet lines show in a row whose group hashes.
const OFF_PATH_FLOWLET: &str = "not on this row's path (its group hashes, so no flowlet table is read): `ends_message` is what every packet's member choice is given (forward.rs's `decide`: whether the packet ends an RDMA message, which a flowlet or pinned group's choice reads), a mask and a bit test on the opcode";

/// Why telemetry lines show in a row loaded without telemetry.
const OFF_PATH_TELEMETRY: &str = "not on this row's path (telemetry is not loaded: the verifier removed `observe`): live instructions filed under a removed block's last line record (the kernel's `bpf_adj_linfo_after_remove` hands it to the first live instruction after the block)";

/// The entry's why for a row read against the floor, with what the
/// padded floor (the floor with never-run code to about the qp
/// pipeline's JITed size) measured in this run.
fn entry_why(padded_ns: f64) -> String {
    format!(
        "{}. Its budget column is the floor padded with code it never runs to about the qp pipeline's JITed size, measured {padded_ns:+.1} ns against the floor in this run (part 1's `padded floor` primitive): what a program's size and place cost by themselves. The entry's stall after the harness lands on a program's first instructions: the floor's and the padded floor's profiles (`rocev2 bench --profile floor`, `--profile rocev2_prim_padded`) show it there as this program's shows it on its first line, so it is the floor's, and left out with the redirect",
        Place::Entry.why()
    )
}

/// The part of a budget a kernel function called from the program is.
fn kernel_place(function: &str) -> Place {
    match function {
        "dev_map_redirect" | "dev_map_hash_redirect" | "xdp_do_redirect" | "bpf_xdp_redirect_map" => Place::Redirect,
        f if f.contains("coarse") => Place::CoarseClock,
        f if f.starts_with("ktime_get") || f == "bpf_ktime_get_ns" || f == "read_tsc" => Place::Clock,
        f if f.contains("htab") || f.contains("lookup_nulls") || f.contains("bpf_lru") || f.contains("jhash") => {
            Place::LruHash
        }
        f if f.contains("return_thunk") || f.contains("safe_ret") => Place::Call,
        // bpf_get_prandom_u32: the ECN queue's draw between its thresholds.
        f if f.contains("prandom") => Place::Ecn,
        _ => Place::Other,
    }
}

/// The part an inlined library line is, if the library code says it
/// (a map lookup's helper call, the devmap's redirect); else its caller's.
fn library_place(library: &str) -> Option<Place> {
    let (location, text) = library.split_once(' ').unwrap_or((library, ""));
    let text = text.trim_matches('`');
    if location.contains("/helpers.rs:") && text == "fun(map, key)" {
        return Some(Place::Lookup);
    }
    // bpf_redirect_map's binding: the floor's work.
    if location.contains("/helpers.rs:") && text == "fun(map, key, flags)" {
        return Some(Place::Redirect);
    }
    // The null test of a lookup's result (`get_ptr_mut`, `get`).
    if location.starts_with("core/src/ptr/non_null.rs:") && text.contains("is_null") {
        return Some(Place::Lookup);
    }
    // Volatile stores outside telemetry are the flow key's (hash.rs's
    // store_flow_key; a unit test checks the sources); classify files
    // telemetry's own by their line.
    if location.starts_with("core/src/ptr/mod.rs:") && text.contains("volatile_store") {
        return Some(Place::FlowKey);
    }
    if location.starts_with("aya-ebpf-") {
        if location.contains("/programs/xdp.rs:") && text.contains("ingress_ifindex") {
            return Some(Place::IngressPort);
        }
        if location.contains("/maps/xdp/") {
            return Some(Place::Redirect);
        }
        if location.contains("/maps/array.rs") || location.contains("/maps/per_cpu_array.rs") {
            return Some(Place::Lookup);
        }
        if location.contains("/maps/hash_map.rs") {
            return Some(Place::LruHash);
        }
    }
    None
}

/// The part a rocev2 source line is, by its file and the function it is in.
fn source_place(file: &str, function: &str) -> Place {
    const EBPF: &str = "rocev2-ebpf/src/";
    const COMMON: &str = "rocev2-common/src/";
    if file.starts_with("rocev2-ebpf/src/tools/") {
        // The floor program's own lines (the tools object).
        return Place::Redirect;
    }
    let (ebpf, name) = match (file.strip_prefix(EBPF), file.strip_prefix(COMMON)) {
        (Some(name), _) => (true, name),
        (None, Some(name)) => (false, name),
        _ => return Place::Other,
    };
    match (ebpf, name, function) {
        (true, "parse.rs", "encode" | "decode" | "pass" | "drop" | "frame_len") => Place::Entry,
        (true, "parse.rs", "ipv4_fields" | "ipv4_ttl_and_options") => Place::Checks,
        (true, "parse.rs", _) => Place::Parse,
        // A parse from scratch (the tools' programs); telemetry's reads of
        // the BTH the pipeline found (PSN, AETH) are its own step.
        (true, "transport.rs", "locate") => Place::Parse,
        (true, "transport.rs", _) => Place::Telemetry,
        (false, "bth.rs", "ends_message") => Place::Flowlet,
        (false, "bth.rs", "psn") => Place::Telemetry,
        (false, "bth.rs", _) => Place::Parse,
        (false, "checksum.rs", "update_u16") => Place::Rewrite,
        (false, "checksum.rs", _) => Place::Parse,
        (false, "hash.rs", "word" | "ipv4_words" | "ipv6_words" | "ipv6_word" | "store_flow_key") => Place::FlowKey,
        (false, "hash.rs", _) => Place::Hash,
        (true, "forward.rs", "flow_key" | "flow_key_v4" | "flow_key_v6") => Place::FlowKey,
        (true, "forward.rs", "decide") => Place::MemberChoice,
        (true, "forward.rs", "new_tos") => Place::Ecn,
        (true, "forward.rs", "forward_v4" | "forward_v6") => Place::Checks,
        (true, "forward.rs", _) => Place::Entry,
        (true, "route.rs", _) => Place::RouteCache,
        (false, "maps.rs", "route_cache_slot" | "cached_target" | "route_target") => Place::RouteCache,
        (false, "maps.rs", "member_index" | "bucket_table_index" | "usable" | "up") => Place::MemberChoice,
        (false, "maps.rs", "member_stat_index") => Place::Counters,
        // FlowletKey::new
        (false, "maps.rs", "new") => Place::Flowlet,
        (true, "maps.rs", "egress_entry") => Place::Ecn,
        (true, "maps.rs", "port_slot") => Place::IngressPort,
        // The `#[xdp]` line: the program's first line record.
        (true, "main.rs", _) => Place::FirstLine,
        (true, "maps.rs" | "redirect.rs" | "ctx.rs" | "args.rs" | "forwarded.rs", _) => Place::Entry,
        (true, "select.rs", "flowlet_position" | "keyless_position" | "new_flowlet_position") => Place::Flowlet,
        (true, "select.rs", _) | (false, "buckets.rs", _) => Place::MemberChoice,
        (false, "flowlet.rs", _) => Place::Flowlet,
        // The forwarded packet's record (Decision::forward): its skb
        // priority, written whether or not classes are loaded.
        (true, "class.rs", "priority") => Place::Entry,
        (_, "class.rs", _) => Place::Classes,
        (_, "ecn.rs", _) => Place::Ecn,
        (true, "rewrite.rs", _) => Place::Rewrite,
        (_, "counters.rs", _) => Place::Counters,
        (_, "features.rs", _) | (true, "pin.rs", _) => Place::Features,
        (_, "telemetry.rs", _) | (false, "arrival.rs", _) => Place::Telemetry,
        _ => Place::Other,
    }
}

/// The part of a budget a profiled line is: a kernel function it called
/// by that function's name, inlined library code by what it does, else the
/// rocev2 line by its file and `function`.
pub fn classify(location: &str, function: Option<&str>, detail: &Detail) -> Place {
    match detail {
        Detail::Kernel(f) => return kernel_place(f),
        Detail::Entry | Detail::Return => return Place::Call,
        Detail::Library(_) | Detail::Own => {}
    }
    let file = location.rsplit_once(':').map_or(location, |(f, _)| f);
    let own = source_place(file, function.unwrap_or(""));
    match detail {
        Detail::Library(library) => match library_place(library) {
            Some(Place::FlowKey) if own == Place::Telemetry => Place::Telemetry,
            // The ingress port's slot lookup is that primitive's.
            Some(Place::Lookup) if own == Place::IngressPort => Place::IngressPort,
            Some(p) => p,
            None => own,
        },
        _ => own,
    }
}

/// One profiled line's share of a part.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub label: String,
    pub ns: f64,
    /// The function around the line, where the sources name one.
    pub function: Option<&'static str>,
}

/// hash.rs's words that the flowlet table's key (`FlowletKey::new`) shares
/// with the member hash: the flowlet step's work on a path with no hash.
const FLOWLET_KEY_WORDS: [&str; 2] = ["ports_word", "protocol_qp_word"];

/// A part's ns per packet (the row's profile minus the compared one's),
/// and its lines, largest first (most negative first if the part is).
#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    pub place: Place,
    pub ns: f64,
    pub lines: Vec<Line>,
}

/// One profile's part in a placement: what it is, the cost above the
/// floor part 1 measured for it, and the factor its lines are scaled by.
#[derive(Clone, Debug, PartialEq)]
pub struct Scaled {
    pub label: String,
    /// Part 1's ns above the floor of this program.
    pub measured: f64,
    /// The profile's own ns per packet on its lines, the redirect apart.
    pub profiled: f64,
    /// measured / profiled.
    pub factor: f64,
    /// The redirect's, the first line's and the harness's profiled ns per
    /// packet (unscaled).
    pub redirect: f64,
    pub first_line: f64,
    pub harness: f64,
    pub seconds: f64,
    pub samples: u64,
    /// Samples in the program's code on no line record.
    pub lineless: u64,
}

/// A budget row's cost placed by its profile (minus the compared one's).
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The row's measured cost (part 1), ns above what it is read against.
    pub cost: f64,
    pub places: Vec<Placed>,
    pub row: Scaled,
    /// A marginal row's: the profile of the row it is read against.
    pub against: Option<Scaled>,
    /// One standard deviation of the placed sum from sampling alone
    /// (each line's samples a Poisson count), after scaling.
    pub noise: f64,
    /// A marginal row's: the features its program loads and the other
    /// program does not (the every-feature-loaded row's, unused).
    pub added_features: Features,
}

impl Placement {
    /// The flowlet key's words (filed under the member hash, whose
    /// functions they are) moved to the flowlet step, for a row whose
    /// packet takes the flowlet step and no member hash: there they are
    /// the key's, which the flowlet step's floor measures.
    fn key_words_as_flowlet(mut self) -> Self {
        let Some(hash) = self.places.iter_mut().find(|x| x.place == Place::Hash) else { return self };
        let (words, rest): (Vec<Line>, Vec<Line>) = std::mem::take(&mut hash.lines)
            .into_iter()
            .partition(|l| l.function.is_some_and(|f| FLOWLET_KEY_WORDS.contains(&f)));
        hash.lines = rest;
        hash.ns -= words.iter().map(|l| l.ns).sum::<f64>();
        if words.is_empty() {
            return self;
        }
        if !self.places.iter().any(|x| x.place == Place::Flowlet) {
            self.places.push(Placed { place: Place::Flowlet, ns: 0.0, lines: Vec::new() });
        }
        let flowlet = self.places.iter_mut().find(|x| x.place == Place::Flowlet).expect("pushed above");
        flowlet.ns += words.iter().map(|l| l.ns).sum::<f64>();
        flowlet.lines.extend(words);
        let sign = if flowlet.ns < 0.0 { -1.0 } else { 1.0 };
        flowlet.lines.sort_by(|a, b| (sign * b.ns).total_cmp(&(sign * a.ns)).then_with(|| a.label.cmp(&b.label)));
        self.places.retain(|x| x.place != Place::Hash || !x.lines.is_empty());
        self
    }

    /// With the features a marginal row's program adds to the other's.
    pub fn adding(self, added_features: Features) -> Self {
        Self { added_features, ..self }
    }

    #[cfg(test)]
    pub fn ns(&self, place: Place) -> f64 {
        self.places.iter().find(|p| p.place == place).map_or(0.0, |p| p.ns)
    }

    /// What the profiles put on lines.
    pub fn placed(&self) -> f64 {
        self.places.iter().map(|p| p.ns).sum::<f64>()
    }

    /// The cost no line is given: a marginal row's measured cost minus
    /// the two rows' costs above the floor (0 for a row read against the
    /// floor, whose lines are scaled to its cost).
    pub fn unplaced(&self) -> f64 {
        self.cost - self.placed()
    }

    /// The parts `split`'s budget counts by primitives, profiled.
    pub fn primitives(&self, split: &Split) -> f64 {
        self.places.iter().filter(|p| p.place.is_budgeted(split)).map(|p| p.ns).sum()
    }

    /// The remainder's steps: the parts the budget does not count.
    pub fn steps(&self, split: &Split) -> f64 {
        self.places.iter().filter(|p| !p.place.is_budgeted(split)).map(|p| p.ns).sum()
    }
}

/// A line's label: `parse.rs:83 ptr_at`, `common/hash.rs:219 mix`, with
/// what ran there (`→ dev_map_redirect`, `(map lookup)`, `(inlined core)`).
fn label(location: &str, function: Option<&str>, detail: &Detail) -> String {
    let short = location
        .strip_prefix("rocev2-ebpf/src/")
        .map(str::to_owned)
        .or_else(|| location.strip_prefix("rocev2-common/src/").map(|l| format!("common/{l}")))
        .unwrap_or_else(|| location.to_owned());
    let mut s = match function {
        Some(f) => format!("{short} {f}"),
        None => short,
    };
    match detail {
        Detail::Own => {}
        Detail::Entry => s.push_str(" (entry)"),
        Detail::Return => s.push_str(" (return)"),
        Detail::Kernel(f) => {
            let _ = write!(s, " → {f}");
        }
        Detail::Library(library) if library_place(library) == Some(Place::Lookup) => s.push_str(" (map lookup)"),
        Detail::Library(library) => {
            // `core/src/ptr/mod.rs:2194 ...` as `core ptr/mod.rs:2194`.
            let location = library.split(' ').next().unwrap_or("");
            let (krate, path) = location.split_once("/src/").unwrap_or((location, ""));
            let krate =
                krate.rsplit_once('-').filter(|(_, v)| v.starts_with(char::is_numeric)).map_or(krate, |(k, _)| k);
            let _ = write!(s, " (inlined {krate} {path})");
        }
    }
    s
}

/// Places `cost` (the row's measured ns above what it is read against)
/// by the profile of the row's program, whose cost above the floor part 1
/// measured as `row.1`, minus for a marginal row the profile of the other
/// program (`against`, with its cost above the floor). `function_of`
/// names the function around a `file:line`.
pub fn place(
    cost: f64,
    row: (&Profile, f64),
    against: Option<(&Profile, f64)>,
    function_of: impl Fn(&str) -> Option<&'static str>,
) -> Placement {
    let mut lines: BTreeMap<(String, Detail), f64> = BTreeMap::new();
    let mut variance = 0.0;
    let mut scaled = Vec::new();
    for (profile, measured, sign) in
        [Some((row.0, row.1, 1.0)), against.map(|(p, m)| (p, m, -1.0))].into_iter().flatten()
    {
        let per = profile.ns_per_sample();
        let place_of = |r: &LineCost| classify(&r.location, function_of(&r.location), &r.detail);
        // The floor's work: its redirect, and the entry's stall on the
        // program's first instructions (the floor's are its redirect's).
        let floors = |p: Place| matches!(p, Place::Redirect | Place::FirstLine);
        let (mut profiled, mut redirect, mut first_line) = (0.0, 0.0, 0.0);
        for r in &profile.rows {
            let ns = r.samples as f64 * per;
            match place_of(r) {
                Place::Redirect => redirect += ns,
                Place::FirstLine => first_line += ns,
                _ => profiled += ns,
            }
        }
        let factor = if profiled > 0.0 { measured / profiled } else { 0.0 };
        for r in profile.rows.iter().filter(|r| !floors(place_of(r))) {
            *lines.entry((r.location.clone(), r.detail.clone())).or_default() += sign * r.samples as f64 * per * factor;
            variance += r.samples as f64 * (per * factor).powi(2);
        }
        scaled.push(Scaled {
            label: profile.label.clone(),
            measured,
            profiled,
            factor,
            redirect,
            first_line,
            harness: profile.harness_samples as f64 * per,
            seconds: profile.seconds,
            samples: profile.program_samples,
            lineless: profile.lineless_samples,
        });
    }
    let mut by_place: BTreeMap<Place, Placed> = BTreeMap::new();
    for ((location, detail), ns) in lines {
        let function = function_of(&location);
        let place = classify(&location, function, &detail);
        let p = by_place.entry(place).or_insert_with(|| Placed { place, ns: 0.0, lines: Vec::new() });
        p.ns += ns;
        p.lines.push(Line { label: label(&location, function, &detail), ns, function });
    }
    let mut places: Vec<Placed> = by_place.into_values().collect();
    for p in &mut places {
        let sign = if p.ns < 0.0 { -1.0 } else { 1.0 };
        p.lines.sort_by(|a, b| (sign * b.ns).total_cmp(&(sign * a.ns)).then_with(|| a.label.cmp(&b.label)));
    }
    let mut scaled = scaled.into_iter();
    Placement {
        cost,
        places,
        row: scaled.next().expect("the row's profile"),
        against: scaled.next(),
        noise: variance.sqrt(),
        added_features: Features::NONE,
    }
}

/// `x`, with what rounds to 0.0 printed as 0.0, not -0.0.
fn tidy(x: f64) -> f64 {
    if x.abs() < 0.05 {
        0.0
    } else {
        x
    }
}

/// Lines a part lists.
const TOP_LINES: usize = 3;

/// The parts a budget can count by primitives.
const ALL_PRIMITIVE_PLACES: [Place; 18] = [
    Place::Parse,
    Place::Hash,
    Place::Lookup,
    Place::LruHash,
    Place::Clock,
    Place::CoarseClock,
    Place::Call,
    Place::IngressPort,
    Place::RouteCache,
    Place::Checks,
    Place::FlowKey,
    Place::Classes,
    Place::MemberChoice,
    Place::Flowlet,
    Place::Ecn,
    Place::Rewrite,
    Place::Counters,
    Place::Telemetry,
];

/// The placement of a budget row as Markdown: a table of its parts (the
/// budget's primitives as profiled beside their measured floors, then the
/// remainder's steps with their top lines and why each stays, then what
/// the profiles could not place), and the remainder's sum.
pub fn render(p: &Placement, split: &Split, floors: &Floors) -> String {
    let refiled;
    let p = if Place::Flowlet.is_budgeted(split) && !Place::Hash.is_budgeted(split) {
        refiled = p.clone().key_words_as_flowlet();
        &refiled
    } else {
        p
    };
    let scaled = |s: &Scaled| {
        format!(
            "`{}` ({:.0} s, {} samples in the program): its lines came to {:.1} ns per packet, scaled by {:.2} to the {:+.1} ns part 1 measured above the floor",
            s.label, s.seconds, s.samples, s.profiled, s.factor, s.measured
        )
    };
    let mut md = match &p.against {
        None => format!("Placed on lines by the profile of {}", scaled(&p.row)),
        Some(a) => format!(
            "Placed on lines by the profile of `{}` ({:.0} s, {} samples in the program): its lines came to {:.1} ns per packet, scaled by {:.2} to {:+.1} ns (the other row's {:+.1} above the floor plus the {:+.1} measured between the two, a median of per-round pairs), minus the profile of {}",
            p.row.label, p.row.seconds, p.row.samples, p.row.profiled, p.row.factor, p.row.measured, a.measured, p.cost, scaled(a)
        ),
    };
    let lineless = p.row.lineless + p.against.as_ref().map_or(0, |a| a.lineless);
    let _ = write!(
        md,
        ". Left out of the scale: the redirect ({:.1} ns in the profile; the floor pays it), the program's first line ({:.1} ns: its prologue and first instructions, where the entry after the test-run harness stalls; the floor's profile shows the same stall on its own first instructions, so the floor pays it) and the test-run harness ({:.1} ns: the dispatcher, the clock reads, the run's set-up, which the floor pays too){}. Sampling error of the placed sum: ±{:.1} ns.\n\n| part | profiled ns | budget ns (measured floors) | top lines (profiled ns) | why it stays |\n|---|---|---|---|---|\n",
        p.row.redirect,
        p.row.first_line,
        p.row.harness,
        if lineless > 0 { format!("; {lineless} samples fell in the program's code on no line record") } else { String::new() },
        p.noise
    );
    let budget_ns = |place: Place| -> Option<f64> {
        let parts: Vec<_> = split.parts.iter().filter(|x| place.primitives().contains(&x.primitive)).collect();
        (!parts.is_empty()).then(|| parts.iter().map(|x| x.ns).sum())
    };
    // Every part profiled, and every primitive the budget counts even if
    // no profiled line was filed under it, in the order of [`Place`].
    let mut shown: Vec<Place> = p.places.iter().map(|x| x.place).collect();
    for place in ALL_PRIMITIVE_PLACES {
        if budget_ns(place).is_some() && !shown.contains(&place) {
            shown.push(place);
        }
    }
    shown.sort();
    let no_lines = Vec::new();
    for place in shown {
        let (ns, placed_lines) =
            p.places.iter().find(|x| x.place == place).map_or((0.0, &no_lines), |x| (x.ns, &x.lines));
        if ns.abs() < 0.05 && budget_ns(place).is_none() {
            continue;
        }
        let lines: Vec<String> = placed_lines
            .iter()
            .filter(|l| l.ns.abs() >= 0.05)
            .take(TOP_LINES)
            .map(|l| format!("`{}` {:.1}", l.label.replace('`', "'"), tidy(l.ns)))
            .collect();
        let more = placed_lines.len().saturating_sub(TOP_LINES);
        let lines = if more > 0 { format!("{}; {more} more", lines.join(", ")) } else { lines.join(", ") };
        let budget = match budget_ns(place) {
            Some(ns) => format!("{ns:.1}"),
            // A step with a floor of its own: the padded floor's, for the entry.
            None if place == Place::Entry && p.against.is_none() => format!("{:.1}", floors.ns(Primitive::PaddedFloor)),
            None => String::new(),
        };
        let why = match (place.is_budgeted(split) || place.primitives().is_empty(), &p.against) {
            (true, None) if place == Place::Entry => entry_why(floors.ns(Primitive::PaddedFloor)),
            (true, _) => place.why().to_owned(),
            // The other row (qp) tries no class: the row's own test of
            // an empty class table.
            (false, Some(_)) if place == Place::Classes => OFF_PATH_CLASSES.to_owned(),
            // The row loads ECN, the other row does not, and no queue is
            // configured: the marker's test that finds none.
            (false, Some(_)) if place == Place::Ecn && p.added_features.contains(Features::ECN) => {
                LOADED_UNUSED_ECN.to_owned()
            }
            (false, Some(_)) => "not in this row's budget: both programs run it, so what shows is the difference of two profiles (sampling noise, or the added work slowing what is around it)".to_owned(),
            (false, None) => place.off_path_why().to_owned(),
        };
        let _ = writeln!(
            md,
            "| {}{} | {:.1} | {budget} | {lines} | {why} |",
            if place.is_budgeted(split) { "" } else { "step: " },
            place.title(),
            tidy(ns),
        );
    }
    // Nothing, when the bench scales a marginal row's profile to the other
    // row's cost plus the marginal (see `place`'s callers).
    let unplaced = tidy(p.unplaced());
    if unplaced != 0.0 {
        let _ = writeln!(
            md,
            "| not placed: the measured cost minus the two profiles' scaled sums | {unplaced:.1} | | | what the two rows' costs, to which their profiles are scaled, leave of the marginal: no line's |"
        );
    }
    let _ = writeln!(md, "| sum: the row's measured cost | {:.1} | {:.1} | | |\n", p.cost, split.accounted);
    let _ = write!(
        md,
        "The remainder, {:.1} ns = {:.1} on the steps above {:+.1} by which the primitives' lines exceed their measured floors ({:.1} profiled, {:.1} measured)",
        split.remainder,
        p.steps(split),
        p.primitives(split) - split.accounted,
        p.primitives(split),
        split.accounted,
    );
    if unplaced != 0.0 {
        let _ = write!(md, " {unplaced:+.1} not placed");
    }
    md.push_str(".\n\n");
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testbed::bench::{
        budget::{split, Floors, QP_PATH, UNUSED_STEPS},
        profile::LineCost,
    };

    #[test]
    fn the_function_around_a_line_is_the_nearest_declaration_above_it() {
        let src = "//! fn not_this\nuse x;\n\npub(crate) const fn first<T>(a: u32) -> u32 {\n    a + 1\n}\n\n    pub unsafe fn second() {\n        let f = |x| x;\n    }\n";
        assert_eq!(function_in(src, 2), None);
        assert_eq!(function_in(src, 4), Some("first"));
        assert_eq!(function_in(src, 5), Some("first"));
        assert_eq!(function_in(src, 9), Some("second"));
        assert_eq!(declared_fn("    fn helper(x: u32)"), Some("helper"));
        assert_eq!(declared_fn("let fnord = 1;"), None);
    }

    #[test]
    fn the_built_in_sources_name_the_functions_of_the_hot_lines() {
        // checksum.rs: the header check's fold and the rewrite's update.
        let line_of = |file: &str, needle: &str| {
            let src = SOURCES.iter().find(|(f, _)| *f == file).unwrap().1;
            src.lines().position(|l| l.contains(needle)).unwrap() as u32 + 2
        };
        let fold = line_of("rocev2-common/src/checksum.rs", "pub fn fold(");
        assert_eq!(function_at(&format!("rocev2-common/src/checksum.rs:{fold}")), Some("fold"));
        let update = line_of("rocev2-common/src/checksum.rs", "pub fn update_u16(");
        assert_eq!(function_at(&format!("rocev2-common/src/checksum.rs:{update}")), Some("update_u16"));
        let slot = line_of("rocev2-common/src/maps.rs", "pub fn route_cache_slot(");
        assert_eq!(function_at(&format!("rocev2-common/src/maps.rs:{slot}")), Some("route_cache_slot"));
        assert_eq!(function_at("rocev2-ebpf/src/nowhere.rs:3"), None);
    }

    #[test]
    fn outside_telemetry_only_the_flow_key_stores_volatile() {
        for (file, src) in SOURCES {
            if src.contains("write_volatile(") && source_place(file, "") != Place::Telemetry {
                assert_eq!(
                    *file, "rocev2-common/src/hash.rs",
                    "classify files a volatile store outside telemetry under the flow key (store_flow_key)"
                );
            }
        }
    }

    #[test]
    fn lines_are_filed_under_primitives_steps_or_the_floor() {
        let own = Detail::Own;
        let c = |loc: &str, f: Option<&str>, d: &Detail| classify(loc, f, d);
        assert_eq!(c("rocev2-ebpf/src/parse.rs:83", Some("ptr_at"), &own), Place::Parse);
        assert_eq!(c("rocev2-ebpf/src/parse.rs:60", Some("decode"), &own), Place::Entry);
        assert_eq!(c("rocev2-common/src/checksum.rs:30", Some("fold"), &own), Place::Parse);
        assert_eq!(c("rocev2-common/src/checksum.rs:20", Some("update_u16"), &own), Place::Rewrite);
        assert_eq!(c("rocev2-common/src/hash.rs:219", Some("mix"), &own), Place::Hash);
        assert_eq!(c("rocev2-common/src/hash.rs:175", Some("ipv4_words"), &own), Place::FlowKey);
        assert_eq!(c("rocev2-ebpf/src/route.rs:50", Some("cached_route"), &own), Place::RouteCache);
        assert_eq!(c("rocev2-common/src/maps.rs:230", Some("route_cache_slot"), &own), Place::RouteCache);
        assert_eq!(c("rocev2-common/src/maps.rs:245", Some("cached_target"), &own), Place::RouteCache);
        assert_eq!(c("rocev2-common/src/maps.rs:275", Some("route_target"), &own), Place::RouteCache);
        assert_eq!(c("rocev2-ebpf/src/rewrite.rs:40", Some("set_macs"), &own), Place::Rewrite);
        assert_eq!(c("rocev2-common/src/counters.rs:36", Some("add"), &own), Place::Counters);
        assert_eq!(c("rocev2-ebpf/src/select.rs:95", Some("flowlet_position"), &own), Place::Flowlet);
        assert_eq!(c("rocev2-ebpf/src/select.rs:72", Some("member_of"), &own), Place::MemberChoice);
        assert_eq!(c("rocev2-ebpf/src/forward.rs:237", Some("forward_v4"), &own), Place::Checks);
        assert_eq!(c("rocev2-ebpf/src/parse.rs:190", Some("ipv4_fields"), &own), Place::Checks);
        assert_eq!(c("rocev2-ebpf/src/parse.rs:205", Some("ipv4_ttl_and_options"), &own), Place::Checks);
        assert_eq!(c("rocev2-ebpf/src/parse.rs:220", Some("is_fragment"), &own), Place::Parse, "the parse primitive's");
        assert_eq!(c("rocev2-ebpf/src/class.rs:70", Some("matched"), &own), Place::Classes);
        assert_eq!(c("rocev2-common/src/class.rs:80", Some("matches"), &own), Place::Classes);
        assert_eq!(c("rocev2-ebpf/src/class.rs:96", Some("priority"), &own), Place::Entry, "the record's field");
        assert_eq!(c("rocev2-ebpf/src/forward.rs:92", Some("forward"), &own), Place::Entry);
        assert_eq!(c("rocev2-ebpf/src/tools/main.rs:90", Some("rocev2_xdp_redirect"), &own), Place::Redirect);
        assert_eq!(c("rocev2-ebpf/src/ecn.rs:29", None, &own), Place::Ecn);
        assert_eq!(c("rocev2-ebpf/src/transport.rs:50", Some("locate"), &own), Place::Parse);
        assert_eq!(c("rocev2-common/src/bth.rs:168", Some("psn"), &own), Place::Telemetry);
        assert_eq!(c("rocev2-ebpf/src/transport.rs:80", Some("aeth_syndrome"), &own), Place::Telemetry);
        assert_eq!(c("somewhere/else.rs:1", None, &own), Place::Other);
        // Kernel functions by name, whichever line called them.
        let k = |f: &str| Detail::Kernel(f.into());
        assert_eq!(c("rocev2-ebpf/src/parse.rs:60", None, &k("dev_map_redirect")), Place::Redirect);
        assert_eq!(c("rocev2-ebpf/src/forward.rs:195", None, &k("ktime_get_mono_fast_ns")), Place::Clock);
        assert_eq!(c("rocev2-ebpf/src/select.rs:95", None, &k("__htab_map_lookup_elem")), Place::LruHash);
        assert_eq!(c("rocev2-ebpf/src/select.rs:95", None, &k("lookup_nulls_elem_raw")), Place::LruHash);
        assert_eq!(c("rocev2-ebpf/src/telemetry.rs:1", None, &k("bpf_ktime_get_coarse_ns")), Place::CoarseClock);
        assert_eq!(c("rocev2-ebpf/src/ecn.rs:1", None, &k("bpf_get_prandom_u32")), Place::Ecn);
        // Inlined library code: a map lookup wherever it is; else its caller's part.
        let lookup = Detail::Library("aya-ebpf-bindings-0.2.0/src/x86_64/helpers.rs:10 `fun(map, key)`".into());
        assert_eq!(c("rocev2-ebpf/src/counters.rs:44", Some("add"), &lookup), Place::Lookup);
        let rotate = Detail::Library("core/src/intrinsics/mod.rs:2032 `unchecked_funnel_shl`".into());
        assert_eq!(c("rocev2-common/src/hash.rs:219", Some("mix"), &rotate), Place::Hash);
        assert_eq!(c("rocev2-ebpf/src/select.rs:62", Some("member_of"), &Detail::Entry), Place::Call);
        assert_eq!(
            label("rocev2-common/src/hash.rs:219", Some("mix"), &rotate),
            "common/hash.rs:219 mix (inlined core intrinsics/mod.rs:2032)"
        );
        // A lookup's null test and the flow key's volatile stores, wherever
        // line info puts them.
        let null_test = Detail::Library("core/src/ptr/non_null.rs:267 `if !ptr.is_null() {`".into());
        assert_eq!(c("rocev2-common/src/maps.rs:249", Some("member_stat_index"), &null_test), Place::Lookup);
        let store = Detail::Library("core/src/ptr/mod.rs:2194 `intrinsics::volatile_store(dst, src);`".into());
        assert_eq!(c("rocev2-ebpf/src/parse.rs:291", Some("parse_l4"), &store), Place::FlowKey);
        assert_eq!(c("rocev2-ebpf/src/telemetry.rs:120", Some("observe"), &store), Place::Telemetry);
        let redirect =
            Detail::Library("aya-ebpf-bindings-0.2.0/src/x86_64/helpers.rs:472 `fun(map, key, flags)`".into());
        assert_eq!(c("rocev2-ebpf/src/parse.rs:60", Some("decode"), &redirect), Place::Redirect);
        let ifindex = Detail::Library(
            "aya-ebpf-0.2.1/src/programs/xdp.rs:39 `unsafe { (*self.ctx).ingress_ifindex as usize }`".into(),
        );
        assert_eq!(c("rocev2-ebpf/src/main.rs:49", None, &ifindex), Place::IngressPort);
        assert_eq!(c("rocev2-ebpf/src/maps.rs:88", Some("port_slot"), &own), Place::IngressPort);
        assert_eq!(
            c("rocev2-ebpf/src/maps.rs:89", Some("port_slot"), &lookup),
            Place::IngressPort,
            "its slot's lookup"
        );
        assert_eq!(c("rocev2-common/src/hash.rs:190", Some("store_flow_key"), &own), Place::FlowKey);
        assert_eq!(c("rocev2-common/src/maps.rs:300", Some("usable"), &own), Place::MemberChoice);
        assert_eq!(c("rocev2-ebpf/src/main.rs:49", None, &own), Place::FirstLine);
        assert_eq!(label("rocev2-ebpf/src/counters.rs:44", Some("add"), &lookup), "counters.rs:44 add (map lookup)");
    }

    fn profile(packets: u64, harness: u64, rows: &[(&str, Detail, u64)]) -> Profile {
        Profile {
            label: "p".into(),
            packets,
            harness_samples: harness,
            program_samples: rows.iter().map(|r| r.2).sum(),
            rows: rows
                .iter()
                .map(|(loc, detail, samples)| LineCost {
                    location: (*loc).into(),
                    text: String::new(),
                    detail: detail.clone(),
                    samples: *samples,
                    insns: 0,
                })
                .collect(),
            seconds: 4.0,
            ..Profile::default()
        }
    }

    fn floors() -> Floors {
        Floors(BTreeMap::from([
            (Primitive::Parse, 20.0),
            (Primitive::Array, 1.0),
            (Primitive::PerCpuArray, 1.0),
            (Primitive::Call, 5.0),
            (Primitive::HashV2Ipv4, 10.0),
            (Primitive::Rewrite, 4.0),
            (Primitive::CounterAdds, 2.0),
            (Primitive::IngressPort, 3.0),
            (Primitive::FlowKeyStores, 2.0),
            (Primitive::GroupChecks, 3.0),
            (Primitive::RouteCache, 1.5),
            (Primitive::Ipv4Checks, 1.0),
            (Primitive::ClassMatch, 0.5),
        ]))
    }

    #[test]
    fn a_row_read_against_the_floor_has_its_lines_scaled_to_its_cost() {
        // 1e9 / 10,000 Hz / 10,000 packets: 10 ns per sample.
        let row = profile(
            10_000,
            5,
            &[
                ("rocev2-ebpf/src/parse.rs:83", Detail::Own, 3),
                ("rocev2-ebpf/src/features.rs:27", Detail::Own, 2),
                ("rocev2-ebpf/src/rewrite.rs:40", Detail::Own, 1),
                ("rocev2-ebpf/src/parse.rs:60", Detail::Kernel("dev_map_redirect".into()), 1),
            ],
        );
        let functions = |loc: &str| match loc {
            "rocev2-ebpf/src/parse.rs:83" => Some("ptr_at"),
            _ => None,
        };
        // 60 ns profiled on the lines (the redirect's 10 apart), 120 measured: x2.
        let p = place(120.0, (&row, 120.0), None, functions);
        assert_eq!((p.row.profiled, p.row.factor, p.row.redirect, p.row.harness), (60.0, 2.0, 10.0, 50.0));
        assert_eq!(p.ns(Place::Parse), 60.0);
        assert_eq!(p.ns(Place::Features), 40.0);
        assert_eq!(p.ns(Place::Rewrite), 20.0);
        assert_eq!(p.ns(Place::Redirect), 0.0, "the floor's work is outside the scale");
        let s = split(120.0, QP_PATH, &floors());
        // The rewrite has a primitive in the qp path's budget: not a step.
        assert_eq!((p.placed(), p.unplaced(), p.steps(&s), p.primitives(&s)), (120.0, 0.0, 40.0, 80.0));
        // Poisson: sqrt(6 samples x (10 ns x 2)^2)
        assert!((p.noise - (6.0f64 * 400.0).sqrt()).abs() < 1e-9);
        assert_eq!(p.places.iter().find(|x| x.place == Place::Parse).unwrap().lines[0].label, "parse.rs:83 ptr_at");

        // The budget's identity: remainder = steps + (primitives profiled -
        // measured) + not placed.
        let sum = p.steps(&s) + (p.primitives(&s) - s.accounted) + p.unplaced();
        assert!((sum - s.remainder).abs() < 1e-9, "{sum} vs {}", s.remainder);
        let md = render(&p, &s, &floors());
        assert!(md.contains("scaled by 2.00 to the +120.0 ns part 1 measured above the floor"), "{md}");
        assert!(md.contains("| parse | 60.0 | 20.0 | `parse.rs:83 ptr_at` 60.0 |"), "{md}");
        assert!(md.contains("| step: feature tests | 40.0 |  | `features.rs:27` 40.0 |"), "{md}");
        assert!(md.contains("| route cache | 0.0 | 1.5 |"), "the route cache's hit is a primitive: {md}");
        assert!(md.contains("| IPv4 field reads and tests | 0.0 | 1.0 |"), "{md}");
        assert!(md.contains("| member hash | 0.0 | 10.0 |"), "a budgeted primitive no line was filed under: {md}");
        assert!(md.contains("| rewrite | 20.0 | 4.0 | `rewrite.rs:40` 20.0 |"), "{md}");
        assert!(md.contains("| counter adds | 0.0 | 2.0 |"), "{md}");
        assert!(!md.contains("not placed"), "{md}");
        assert!(md.contains(&format!("The remainder, {:.1} ns = 40.0 on the steps above", s.remainder)), "{md}");
    }

    #[test]
    fn ecn_and_flowlet_lines_are_their_floors_on_their_paths_and_explained_off_them() {
        let row = profile(
            10_000,
            0,
            &[
                ("rocev2-ebpf/src/ecn.rs:87", Detail::Own, 2),
                ("rocev2-common/src/flowlet.rs:150", Detail::Own, 2),
                ("rocev2-ebpf/src/parse.rs:83", Detail::Own, 2),
            ],
        );
        let p = place(60.0, (&row, 60.0), None, |_| None);
        let mut f = floors();
        f.0.extend([
            (Primitive::EcnQueue, 6.0),
            (Primitive::Clock, 15.0),
            (Primitive::FlowletStep, 5.0),
            (Primitive::LruHash, 25.0),
        ]);
        let md = render(&p, &split(60.0, QP_PATH, &f), &f);
        assert!(
            md.contains(&format!("| step: ECN virtual queue | 20.0 |  | `ecn.rs:87` 20.0 | {OFF_PATH_ECN} |")),
            "{md}"
        );
        assert!(
            md.contains(&format!(
                "| step: flowlet decision and entry update | 20.0 |  | `common/flowlet.rs:150` 20.0 | {OFF_PATH_FLOWLET} |"
            )),
            "{md}"
        );
        let md = render(&p, &split(60.0, crate::testbed::bench::budget::ECN_STEPS, &f), &f);
        assert!(
            md.contains("| ECN virtual queue | 20.0 | 6.0 | `ecn.rs:87` 20.0 | a primitive (the table above)"),
            "{md}"
        );
        let md = render(&p, &split(60.0, crate::testbed::bench::budget::FLOWLET_PATH, &f), &f);
        assert!(
            md.contains(
                "| flowlet decision and entry update | 20.0 | 5.0 | `common/flowlet.rs:150` 20.0 | a primitive (the table above)"
            ),
            "{md}"
        );
    }

    #[test]
    fn an_empty_class_table_in_a_marginal_row_is_no_class_tried() {
        // 10,000 packets: 10 ns per sample; the row 2 samples on matched.
        let row = profile(
            10_000,
            0,
            &[("rocev2-ebpf/src/parse.rs:83", Detail::Own, 3), ("rocev2-ebpf/src/class.rs:70", Detail::Own, 2)],
        );
        let qp = profile(10_000, 0, &[("rocev2-ebpf/src/parse.rs:83", Detail::Own, 3)]);
        let functions = |loc: &str| (loc == "rocev2-ebpf/src/class.rs:70").then_some("matched");
        let p = place(20.0, (&row, 50.0), Some((&qp, 30.0)), functions);
        assert_eq!(p.ns(Place::Classes), 20.0);
        let md = render(&p, &split(20.0, UNUSED_STEPS, &floors()), &floors());
        assert!(
            md.contains(&format!(
                "| step: class matching | 20.0 |  | `class.rs:70 matched` 20.0 | {OFF_PATH_CLASSES} |"
            )),
            "{md}"
        );
    }

    /// The every-feature-loaded row adds ECN to qp without a queue: its
    /// ECN lines are the marker's test that finds none, not a removed
    /// marker, and not work both programs run.
    #[test]
    fn ecn_loaded_without_a_queue_in_a_marginal_row_says_so() {
        // 10,000 packets: 10 ns per sample; the row 2 samples on ecn.rs.
        let row = profile(
            10_000,
            0,
            &[("rocev2-ebpf/src/parse.rs:83", Detail::Own, 3), ("rocev2-ebpf/src/ecn.rs:87", Detail::Own, 2)],
        );
        let qp = profile(10_000, 0, &[("rocev2-ebpf/src/parse.rs:83", Detail::Own, 3)]);
        let unused = split(20.0, UNUSED_STEPS, &floors());
        let p = place(20.0, (&row, 50.0), Some((&qp, 30.0)), |_| None);
        assert_eq!(p.ns(Place::Ecn), 20.0);
        let md = render(&p.clone().adding(Features::ALL.without(Features::TELEMETRY)), &unused, &floors());
        assert!(
            md.contains(&format!("| step: ECN virtual queue | 20.0 |  | `ecn.rs:87` 20.0 | {LOADED_UNUSED_ECN} |")),
            "{md}"
        );
        // Read against a program that loads ECN too: both run it.
        let md = render(&p, &unused, &floors());
        assert!(md.contains("| step: ECN virtual queue | 20.0 |  | `ecn.rs:87` 20.0 | not in this row's budget: both programs run it"), "{md}");
    }

    /// The flowlet key's words are hash.rs functions the member hash
    /// shares: on a flowlet packet's path (no hash) they are the flowlet
    /// step's, and a qp row keeps them under the hash.
    #[test]
    fn the_flowlet_keys_words_are_the_flowlet_steps_where_no_hash_runs() {
        // 10,000 packets: 10 ns per sample.
        let row = profile(
            10_000,
            0,
            &[
                ("rocev2-common/src/hash.rs:309", Detail::Own, 2),
                ("rocev2-common/src/hash.rs:252", Detail::Own, 1),
                ("rocev2-common/src/flowlet.rs:150", Detail::Own, 3),
            ],
        );
        let functions = |loc: &str| match loc {
            "rocev2-common/src/hash.rs:309" => Some("ports_word"),
            "rocev2-common/src/hash.rs:252" => Some("mix"),
            _ => None,
        };
        let p = place(60.0, (&row, 60.0), None, functions);
        assert_eq!((p.ns(Place::Hash), p.ns(Place::Flowlet)), (30.0, 30.0));
        let mut f = floors();
        f.0.extend([(Primitive::FlowletStep, 5.0), (Primitive::LruHash, 25.0), (Primitive::Clock, 15.0)]);
        let md = render(&p, &split(60.0, crate::testbed::bench::budget::FLOWLET_PATH, &f), &f);
        assert!(
            md.contains("| flowlet decision and entry update | 50.0 | 5.0 | `common/flowlet.rs:150` 30.0, `common/hash.rs:309 ports_word` 20.0 |"),
            "{md}"
        );
        assert!(md.contains("| step: member hash | 10.0 |  | `common/hash.rs:252 mix` 10.0 |"), "{md}");
        let md = render(&p, &split(60.0, QP_PATH, &f), &f);
        assert!(md.contains("`common/hash.rs:309 ports_word` 20.0"), "{md}");
        assert!(!md.contains("| flowlet decision and entry update | 50.0"), "{md}");
    }

    #[test]
    fn a_marginal_row_is_its_scaled_profile_minus_the_other_one() {
        let row = profile(
            10_000,
            0,
            &[
                ("rocev2-ebpf/src/parse.rs:83", Detail::Own, 3),
                ("rocev2-ebpf/src/route.rs:50", Detail::Own, 2),
                ("rocev2-ebpf/src/rewrite.rs:40", Detail::Own, 1),
                ("rocev2-ebpf/src/ecn.rs:29", Detail::Own, 4),
            ],
        );
        // 20,000 packets: 5 ns per sample.
        let qp = profile(
            20_000,
            0,
            &[
                ("rocev2-ebpf/src/parse.rs:83", Detail::Own, 6),
                ("rocev2-ebpf/src/route.rs:50", Detail::Own, 4),
                ("rocev2-ebpf/src/rewrite.rs:40", Detail::Own, 2),
            ],
        );
        // The row: 100 ns profiled, 150 measured (x1.5); qp: 60 and 120 (x2).
        let p = place(32.0, (&row, 150.0), Some((&qp, 120.0)), |_| None);
        assert_eq!(p.against.as_ref().map(|a| a.factor), Some(2.0));
        assert_eq!(p.ns(Place::Ecn), 60.0);
        assert_eq!(p.ns(Place::Parse), -15.0, "45 in the row, 60 in qp");
        assert_eq!(p.ns(Place::RouteCache), -10.0);
        assert!((p.placed() - 30.0).abs() < 1e-9, "150 - 120");
        assert!((p.unplaced() - 2.0).abs() < 1e-9, "the marginal's own measurement, 32, against 150 - 120");
        let md = render(&p, &split(32.0, &[], &floors()), &floors());
        assert!(md.contains(", minus the profile of `p`"), "{md}");
        assert!(md.contains("| not placed: the measured cost minus the two profiles' scaled sums | 2.0 |"), "{md}");
        assert!(md.contains("`ecn.rs:29` 60.0"), "{md}");
        assert!(md.contains("| step: parse | -15.0 |  | `parse.rs:83` -15.0 | not in this row's budget"), "{md}");
        assert!(md.contains("+2.0 not placed."), "{md}");
        // As the bench places a marginal: the row scaled to the other's
        // cost plus the marginal, so nothing is left unplaced.
        let p = place(32.0, (&row, 152.0), Some((&qp, 120.0)), |_| None);
        assert!(p.unplaced().abs() < 1e-9);
        let md = render(&p, &split(32.0, &[], &floors()), &floors());
        assert!(!md.contains("not placed"), "{md}");
        assert!(
            md.contains("scaled by 1.52 to +152.0 ns (the other row's +120.0 above the floor plus the +32.0 measured"),
            "{md}"
        );
    }
}
