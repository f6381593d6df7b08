//! The configuration reference: every table and key of the file, with its
//! type, default and meaning. The one source of the book's reference page
//! (`docs/src/config-reference.md`, [`markdown`]) and of the
//! `rocev2.toml(5)` man page ([`man_page`], written by `rocev2 man`).
//!
//! The tests below hold it to the parser: a key serde accepts (the `Raw*`
//! structs, nested tables included) that is missing here fails, and so
//! does a key listed here that the parser does not know; the defaults the
//! code keeps as constants are compared with the ones written here; the
//! book's page must be what [`markdown`] renders (`ROCEV2_BLESS=1` rewrites
//! it).

/// One table of the file (`[dataplane]`, `[[group]]`, the inline
/// `members` entries, ...).
pub struct Table {
    /// Its path in the file: `dataplane`, `group`, `group.members`.
    pub path: &'static str,
    /// Other places the same table appears (`transport_aware` in a group
    /// and in a route policy).
    pub also: &'static [&'static str],
    /// How it is written.
    pub form: Form,
    /// What it is for, and its limits.
    pub about: &'static str,
    /// Its keys, in groups (so `[[group]]` and `[[route_policy]]` can
    /// share their policy keys).
    pub keys: &'static [&'static [Key]],
}

/// How a table is written in the file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Form {
    /// `[name]`, at most once.
    Table,
    /// `[[name]]`, any number of times.
    ArrayOfTables,
    /// `key = [ { ... }, ... ]` inside another table.
    InlineArray,
    /// `key = { ... }` inside another table.
    InlineTable,
}

/// One key.
pub struct Key {
    pub name: &'static str,
    /// The values it takes.
    pub ty: &'static str,
    /// Its default, or [`REQUIRED`].
    pub default: &'static str,
    /// What it does.
    pub about: &'static str,
}

/// The default of a key that has none: the file must set it.
pub const REQUIRED: &str = "required";

const POLICY_KEYS: &[Key] = &[
    Key {
        name: "hash",
        ty: "\"qp\" or \"five-tuple\"",
        default: "[dataplane] hash",
        about: "The hash of this group, overriding `[dataplane] hash`.",
    },
    Key {
        name: "policy",
        ty: "\"hash\", \"flowlet\" or \"pinned\"",
        default: "\"hash\"",
        about: "How a packet picks its member: by its hash alone; by flowlets (a flow idle for `flowlet_gap_us` may move, its packets never reorder); or by `[[pin]]`s first and `qp` hashing for the rest.",
    },
    Key {
        name: "flowlet_gap_us",
        ty: "integer, 1 to 10000000 (µs)",
        default: "50",
        about: "Flowlet groups: the idle time after which a flow starts a new flowlet and may take another member.",
    },
    Key {
        name: "flowlet_choice",
        ty: "\"rehash\" or \"least-loaded\"",
        default: "\"rehash\"",
        about: "Flowlet groups: a new flowlet re-hashes with its flowlet number (LetFlow), or takes the less loaded of two candidate members by their egress virtual queues.",
    },
    Key {
        name: "flowlet_boundary",
        ty: "boolean",
        default: "false",
        about: "Flowlet groups: move a flow only right after a packet that ended an RDMA message (`*_LAST`, `*_ONLY`, ACK).",
    },
    Key {
        name: "flowlet_table",
        ty: "\"keyed\" or \"keyless\"",
        default: "\"keyed\"",
        about: "Flowlet groups: an LRU table keyed by the flow, or hash-indexed slots without a key compare, as switch ASICs keep them (flows in one slot share its flowlet).",
    },
    Key {
        name: "flowlet_table_size",
        ty: "integer: keyed 1 to 16777216 flows; keyless 1 to 1048576 slots",
        default: "keyed 65536; keyless 4096",
        about: "Flowlet groups: the flows a keyed table keeps state for, or a keyless table's slots (rounded up to a power of two). Raising it needs a restart (a reload may lower it).",
    },
    Key {
        name: "rebalance",
        ty: "\"immediate\" or \"gradual\"",
        default: "\"immediate\"",
        about: "A member that returns gets its buckets back at once, or one bucket every 100 ms.",
    },
    Key {
        name: "transport_aware",
        ty: "inline table (see transport_aware)",
        default: "off",
        about: "Demote members whose QPs see NAKs, resends or CNPs (needs `[dataplane] telemetry_qps`).",
    },
];

/// Every table of the file, in the order the reference lists them.
pub const TABLES: &[Table] = &[
    Table {
        path: "dataplane",
        also: &[],
        form: Form::Table,
        about: "How the dataplane hashes, attaches and pins. Optional: every key has a default. A change of `pin_dir`, `attach`, `xdp_mode` or `cpu_spread`, and turning `telemetry_qps` on or raising it, need a restart.",
        keys: &[&[
            Key {
                name: "hash",
                ty: "\"qp\" or \"five-tuple\"",
                default: "\"qp\"",
                about: "The hash of every group that does not set its own: `qp` hashes the five-tuple and the BTH destination QP (Enhanced ECMP), `five-tuple` the five-tuple only.",
            },
            Key {
                name: "hash_seed",
                ty: "integer 0 to 4294967295, or \"auto\"",
                default: "0",
                about: "The seed of the hash; another seed reshuffles every flow. `auto` derives it from this box's port MACs, so every switch of a fabric has its own (no polarization).",
            },
            Key {
                name: "hash_version",
                ty: "1 or 2",
                default: "1 (new configs: 2)",
                about: "Which hash places flows. 2 (for new configs) is MurmurHash3 over the words a family carries: 4 for IPv4 (addresses, ports, protocol with DestQP), 10 for IPv6; the cheaper hash per packet. 1 hashes a fixed 11-word key (IPv4's unused address words as zeros): a config without the key keeps it, so an existing fabric keeps its placement. Another version moves flows as another seed does; `explain` and `entropy` predict with the version given.",
            },
            Key {
                name: "xdp_mode",
                ty: "\"native\" or \"skb\"",
                default: "\"native\"",
                about: "XDP in the driver, or generic (skb) XDP for a driver without native XDP; `run --xdp-mode` overrides it.",
            },
            Key {
                name: "pin_dir",
                ty: "absolute path on the BPF filesystem",
                default: "\"/sys/fs/bpf/rocev2\"",
                about: "Where `run` pins its maps and links (mode 0700); one directory per instance, which `stats`, `top`, `trace`, `reload`, `upgrade` and `detach` find it by.",
            },
            Key {
                name: "neighbour_refresh_ms",
                ty: "integer, 100 to 60000 (ms)",
                default: "1000",
                about: "How often `run` refreshes each member's neighbour entry (ARP/NDP) and re-reads the box's own addresses.",
            },
            Key {
                name: "attach",
                ty: "\"xdp\" or \"tc\"",
                default: "\"xdp\"",
                about: "Forward in XDP (fastest), or in tc ingress, where a class's skb priority reaches the egress qdisc (HTB).",
            },
            Key {
                name: "telemetry_qps",
                ty: "integer, 0 to 1048576",
                default: "0 (off)",
                about: "QPs the per-QP transport telemetry table (PSNs, NAKs, resends, CNPs) is sized for: twice as many slots, a power of two; `top`, `trace` and `transport_aware` need it.",
            },
            Key {
                name: "cpu_spread",
                ty: "\"off\" or \"qp\"",
                default: "\"off\"",
                about: "`qp` hands each RoCE flow to a CPU by its qp hash (a CPU map), so flows that RSS puts on one CPU are forwarded by all of them, each QP in order.",
            },
        ]],
    },
    Table {
        path: "port",
        also: &[],
        form: Form::ArrayOfTables,
        about: "An interface that receives traffic to route: at least one unless a `[bridge]` is configured; ports and bridge ports together at most 63. Egress devices need not be ports.",
        keys: &[&[Key {
            name: "name",
            ty: "interface name",
            default: REQUIRED,
            about: "The interface, in the namespace `run` runs in; each listed once.",
        }]],
    },
    Table {
        path: "group",
        also: &[],
        form: Form::ArrayOfTables,
        about: "A next-hop group: the members a route's traffic is spread over, by a table of 256 buckets filled in proportion to their weights. At most 256 groups, the config's and the learned ones together.",
        keys: &[
            &[Key {
                name: "name",
                ty: "string",
                default: REQUIRED,
                about: "The group's name, which `[[route]]`s and `[[pin]]`s use.",
            }],
            POLICY_KEYS,
            &[Key {
                name: "members",
                ty: "array of inline tables (see group.members)",
                default: REQUIRED,
                about: "The next hops, 1 to 128.",
            }],
        ],
    },
    Table {
        path: "group.members",
        also: &[],
        form: Form::InlineArray,
        about: "One member of a group: an egress device and its neighbour, by `via` (the MAC from the kernel's neighbour table) or by `mac`.",
        keys: &[&[
            Key { name: "dev", ty: "interface name", default: REQUIRED, about: "The device the member's packets leave by." },
            Key {
                name: "via",
                ty: "IPv4 or IPv6 address",
                default: "none (then `mac`)",
                about: "The next hop; its MAC comes from the kernel's neighbour table, resolved if missing (a neighbour that does not answer within 5 s leaves the group until it does).",
            },
            Key {
                name: "mac",
                ty: "MAC address, \"02:00:00:00:00:04\"",
                default: "none (then `via`)",
                about: "A static neighbour MAC.",
            },
            Key {
                name: "weight",
                ty: "integer, 1 to 65535",
                default: "1",
                about: "The member's share of the group's buckets relative to the others.",
            },
        ]],
    },
    Table {
        path: "group.transport_aware",
        also: &["route_policy.transport_aware", "uplink_group.transport_aware"],
        form: Form::InlineTable,
        about: "Transport-aware member choice, on a `[[group]]` or a `[[route_policy]]`: a member's score adds up the NAKs, resends and CNPs of the QPs it carries and decays with a half-life; above `demote_above` its buckets go to the others, below `restore_below` it gets them back. `transport_aware = {}` takes every default.",
        keys: &[&[
            Key {
                name: "demote_above",
                ty: "number",
                default: "20",
                about: "A member whose score rises above this is demoted.",
            },
            Key {
                name: "restore_below",
                ty: "number, below demote_above",
                default: "2",
                about: "A demoted member whose score decays below this is restored.",
            },
            Key {
                name: "half_life_ms",
                ty: "integer, 100 to 3600000 (ms)",
                default: "2000",
                about: "The score halves in this time without new trouble.",
            },
            Key { name: "nak_weight", ty: "number", default: "1", about: "What one sequence-error NAK adds to the score." },
            Key {
                name: "retransmit_weight",
                ty: "number",
                default: "1",
                about: "What one resend (a PSN jump back) adds to the score.",
            },
            Key { name: "cnp_weight", ty: "number", default: "0.1", about: "What one CNP adds to the score." },
            Key {
                name: "repick",
                ty: "\"idle\" or \"idle-or-acked\"",
                default: "\"idle\"",
                about: "Flowlet groups: `idle-or-acked` also ends a QP's flowlet when an ACK covers everything it sent.",
            },
        ]],
    },
    Table {
        path: "route",
        also: &[],
        form: Form::ArrayOfTables,
        about: "A route of the config: the longest prefix wins; IPv4 and IPv6. At most 131072 per family.",
        keys: &[&[
            Key {
                name: "prefix",
                ty: "IPv4 or IPv6 prefix, no host bits set",
                default: REQUIRED,
                about: "The destinations.",
            },
            Key { name: "group", ty: "group name", default: REQUIRED, about: "The group their traffic is spread over." },
        ]],
    },
    Table {
        path: "pin",
        also: &[],
        form: Form::ArrayOfTables,
        about: "A pinned path (centralized traffic engineering): the packets of one destination QP to one destination go to one member of a `pinned` group; while that member is down they are hashed.",
        keys: &[&[
            Key { name: "prefix", ty: "IPv4 or IPv6 prefix or address", default: REQUIRED, about: "The destinations." },
            Key { name: "qp", ty: "integer, 0 to 0xFFFFFF", default: REQUIRED, about: "The BTH destination QP." },
            Key {
                name: "group",
                ty: "group name",
                default: "none: a learned route's group",
                about: "The `pinned` group. Without it the pin is for a route learned from the kernel (`[routing] source = \"kernel\"`), whose group a `[[route_policy]]` makes `pinned`.",
            },
            Key {
                name: "member",
                ty: "interface name, or a next-hop address for a learned group",
                default: REQUIRED,
                about: "The member the pinned packets take.",
            },
        ]],
    },
    Table {
        path: "ecn_profile",
        also: &[],
        form: Form::ArrayOfTables,
        about: "A WRED/ECN marking shape for `[[egress]]` queues and classes: above `kmin` an ECT packet is marked CE with a probability rising to `pmax` at `kmax`, above `kmax` always.",
        keys: &[&[
            Key { name: "name", ty: "string", default: REQUIRED, about: "The profile's name." },
            Key {
                name: "kmin",
                ty: "bytes: an integer, or a string with B, KB, MB, GB, KiB, MiB or GiB",
                default: REQUIRED,
                about: "Queue depth where marking starts.",
            },
            Key {
                name: "kmax",
                ty: "bytes, as kmin, above it",
                default: REQUIRED,
                about: "Queue depth where every ECT packet is marked.",
            },
            Key {
                name: "pmax",
                ty: "probability: 0 to 1, or \"0%\" to \"100%\"",
                default: REQUIRED,
                about: "The marking probability at `kmax`.",
            },
            Key {
                name: "drop_not_ect",
                ty: "boolean",
                default: "false",
                about: "Drop Not-ECT packets above `kmax` (they are counted either way, never marked).",
            },
        ]],
    },
    Table {
        path: "egress",
        also: &[],
        form: Form::ArrayOfTables,
        about: "A virtual queue on an egress port: every forwarded packet's bytes fill it and it drains at `rate`; ECN marks from its depth.",
        keys: &[&[
            Key { name: "dev", ty: "interface name", default: REQUIRED, about: "The egress port; each listed once." },
            Key {
                name: "rate",
                ty: "bits per second: an integer, or a string with K, M, G or T (\"25Gbit\", \"100M\")",
                default: REQUIRED,
                about: "The rate the queue drains at: the port's rate.",
            },
            Key {
                name: "ecn_profile",
                ty: "profile name",
                default: "none (no marking)",
                about: "The profile this port's packets are marked by, unless their class names another.",
            },
            Key {
                name: "local",
                ty: "boolean",
                default: "false",
                about: "Also classify and mark traffic this box sends itself (a tc egress program).",
            },
        ]],
    },
    Table {
        path: "class",
        also: &[],
        form: Form::ArrayOfTables,
        about: "A priority class, matched in order; a packet takes the first that matches. Without any `[[class]]` one built-in class `control` matches ACK (0x11) and CNP (0x81) and exempts them from marking; `class = []` turns classes off.",
        keys: &[&[
            Key { name: "name", ty: "string", default: REQUIRED, about: "The class's name (in `stats` and metrics)." },
            Key {
                name: "opcodes",
                ty: "array of integers, 0 to 255",
                default: "any opcode",
                about: "Match only these BTH opcodes.",
            },
            Key {
                name: "max_payload",
                ty: "integer (bytes)",
                default: "any size",
                about: "Match only packets with at most this many bytes after the BTH (a CTS-like small message).",
            },
            Key {
                name: "qps",
                ty: "destination QP range: \"0x100-0x1ff\", [256, 511] or one QP",
                default: "any QP",
                about: "Match only these destination QPs.",
            },
            Key {
                name: "dscp",
                ty: "array of integers, 0 to 63",
                default: "any DSCP",
                about: "Match only these incoming DSCPs.",
            },
            Key {
                name: "set_dscp",
                ty: "integer, 0 to 63",
                default: "unchanged",
                about: "Rewrite the DSCP (masked from the ICRC, which stays valid).",
            },
            Key {
                name: "priority",
                ty: "tc class id \"1:10\" (hex, as tc writes it) or an integer",
                default: "unchanged",
                about: "The skb priority; it takes effect with `attach = \"tc\"` and for `local` traffic.",
            },
            Key { name: "ecn_exempt", ty: "boolean", default: "false", about: "Never mark or drop the class's packets by ECN." },
            Key {
                name: "ecn_profile",
                ty: "profile name",
                default: "the egress port's",
                about: "A profile for this class instead of the port's.",
            },
        ]],
    },
    Table {
        path: "routing",
        also: &[],
        form: Form::Table,
        about: "Where routes come from. A change needs a restart.",
        keys: &[&[
            Key {
                name: "source",
                ty: "\"config\" or \"kernel\"",
                default: "\"config\"",
                about: "`[[route]]`s only, or also mirror a kernel routing table (as FRR, BIRD or `ip route` fill it) and follow its changes.",
            },
            Key {
                name: "table",
                ty: "\"main\", a table number (1 to 4294967295, not 255), or a VRF device name",
                default: "\"main\"",
                about: "The kernel table to follow; only with `source = \"kernel\"`.",
            },
        ]],
    },
    Table {
        path: "route_policy",
        also: &[],
        form: Form::ArrayOfTables,
        about: "How the groups learned from kernel routes behave, by prefix: the most specific policy covering a route wins; changes apply on reload.",
        keys: &[
            &[Key {
                name: "prefix",
                ty: "IPv4 or IPv6 prefix",
                default: REQUIRED,
                about: "The learned routes this policy covers.",
            }],
            POLICY_KEYS,
        ],
    },
    Table {
        path: "bridge",
        also: &[],
        form: Form::Table,
        about: "Host bridge mode: rocev2 serves every port of this Linux bridge at layer 2, mirroring its ports (with their STP state) and its forwarding database. Known unicast IP frames leave unchanged by the port the FDB names; MACs of an `[[uplink_group]]` take a member chosen per flow; the rest goes to the kernel bridge. `[[port]]`s may route on other interfaces at the same time. Needs `attach = \"xdp\"` and `cpu_spread = \"off\"`; changing `name` needs a restart.",
        keys: &[&[Key {
            name: "name",
            ty: "interface name",
            default: REQUIRED,
            about: "The bridge (`ip link add NAME type bridge`), without VLAN filtering.",
        }]],
    },
    Table {
        path: "uplink_group",
        also: &[],
        form: Form::ArrayOfTables,
        about: "Bridge ports that all reach the same MACs (uplinks to rack switches sharing an anycast gateway): frames to those MACs take a member chosen as a `[[group]]`'s are, by the same bucket table, hash, flowlets and pins; a port that stops forwarding moves only its own flows. Needs a `[bridge]`; counts among the 256 groups.",
        keys: &[
            &[
                Key {
                    name: "name",
                    ty: "string",
                    default: REQUIRED,
                    about: "The group's name (unique among `[[group]]`s and `[[uplink_group]]`s), which `stats` and `[[pin]]`s use.",
                },
                Key {
                    name: "ports",
                    ty: "array of interface names",
                    default: REQUIRED,
                    about: "Ports of the bridge, 2 to 128, each in one uplink group.",
                },
                Key {
                    name: "macs",
                    ty: "array of MAC addresses, or \"learned\"",
                    default: REQUIRED,
                    about: "The unicast MACs reachable through every port of the group (an anycast gateway's), whatever port the bridge learned them on; or every MAC the bridge learns on any port of the group.",
                },
            ],
            POLICY_KEYS,
        ],
    },
];

impl Table {
    /// Every key of the table.
    pub fn all_keys(&self) -> impl Iterator<Item = &Key> {
        self.keys.iter().flat_map(|group| group.iter())
    }

    /// How the table is written in a file (Markdown: code in backticks).
    pub fn heading(&self) -> String {
        let last = self.path.rsplit('.').next().unwrap_or(self.path);
        let parent = |path: &str| path.rsplit_once('.').map_or(path, |(parent, _)| parent).to_string();
        match self.form {
            Form::Table => format!("`[{}]`", self.path),
            Form::ArrayOfTables => format!("`[[{}]]`", self.path),
            Form::InlineArray => format!("`{last} = [{{ ... }}]` in `[[{}]]`", parent(self.path)),
            Form::InlineTable => {
                let places: Vec<String> = std::iter::once(self.path)
                    .chain(self.also.iter().copied())
                    .map(|p| format!("`[[{}]]`", parent(p)))
                    .collect();
                format!("`{last} = {{ ... }}` in {}", places.join(" and "))
            }
        }
    }
}

/// The book's reference page.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         <!-- Generated from rocev2-user/src/control/config/reference.rs; do not edit by hand.\n     \
         After changing that file: ROCEV2_BLESS=1 cargo test -p rocev2-user reference -->\n\n\
         Every table and key of the configuration file (`/etc/rocev2/rocev2.toml`\n\
         unless `--config` names another), with its type, default and meaning.\n\
         The same text is the man page `rocev2.toml(5)` (`man rocev2.toml`).\n\
         A key not listed here is an error (`check` names it and suggests the\n\
         closest one).\n",
    );
    for table in TABLES {
        out.push_str(&format!("\n## {}\n\n{}\n\n", table.heading(), table.about));
        out.push_str("| key | type | default | meaning |\n|---|---|---|---|\n");
        for key in table.all_keys() {
            let default =
                if key.default == REQUIRED { "**required**".to_string() } else { code_if_literal(key.default) };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                key.name,
                quoted_as_code(key.ty).replace('|', "\\|"),
                default,
                key.about.replace('|', "\\|")
            ));
        }
    }
    out
}

/// `text` with every "quoted" value in backticks.
fn quoted_as_code(text: &str) -> String {
    let mut out = String::new();
    for (i, part) in text.split('"').enumerate() {
        match i % 2 {
            0 => out.push_str(part),
            _ => out.push_str(&format!("`\"{part}\"`")),
        }
    }
    out
}

/// A default that is a value (`"qp"`, `1000`) in backticks; a phrase as
/// it is.
fn code_if_literal(default: &str) -> String {
    let literal = default.starts_with('"')
        || default.chars().all(|c| c.is_ascii_digit() || c == '.')
        || matches!(default, "true" | "false");
    if literal {
        format!("`{default}`")
    } else {
        default.to_string()
    }
}

/// The man page `rocev2.toml(5)`, in roff (man macros).
pub fn man_page(version: &str) -> String {
    let mut out = String::new();
    out.push_str(&format!(".TH ROCEV2.TOML 5 \"\" \"rocev2 {}\" \"File Formats\"\n", roff(version)));
    out.push_str(".SH NAME\nrocev2.toml \\- configuration file of rocev2, the RoCEv2\\-aware XDP dataplane\n");
    out.push_str(".SH SYNOPSIS\n/etc/rocev2/rocev2.toml\n");
    out.push_str(".SH DESCRIPTION\n");
    out.push_str(
        "A TOML file read by \\fBrocev2 run\\fR, \\fBcheck\\fR and \\fBexplain\\fR, and by \\fBstats\\fR, \\fBtop\\fR, \\fBtrace\\fR, \\fBreload\\fR, \\fBupgrade\\fR and \\fBdetach\\fR \
         to find the running instance (\\fB\\-\\-config\\fR names another). Every error names the file, line, column, key and the fix; \
         a key not listed here is an error. \\fBrocev2 check \\-\\-offline\\fR checks a file without looking up its interfaces.\n",
    );
    for table in TABLES {
        out.push_str(&format!(".SH {}\n{}\n", roff(&table.heading()), roff(table.about)));
        for key in table.all_keys() {
            let default =
                if key.default == REQUIRED { "required".to_string() } else { format!("default {}", key.default) };
            out.push_str(&format!(
                ".TP\n\\fB{}\\fR ({}; {})\n{}\n",
                roff(key.name),
                roff(key.ty),
                roff(&default),
                roff(key.about)
            ));
        }
    }
    out.push_str(".SH EXAMPLE\n.nf\n");
    for line in EXAMPLE.lines() {
        out.push_str(&roff(line));
        out.push('\n');
    }
    out.push_str(".fi\n.SH SEE ALSO\n\\fBrocev2\\fR(1), \\fBrocev2\\-run\\fR(1), \\fBrocev2\\-check\\fR(1)\n");
    out
}

/// The minimal file the man page shows.
const EXAMPLE: &str = r#"[[port]]
name = "eth1"

[[group]]
name = "uplinks"
members = [
  { dev = "eth2", via = "10.0.2.2" },
  { dev = "eth3", via = "10.0.3.2" },
]

[[route]]
prefix = "10.1.0.0/16"
group = "uplinks"
"#;

/// `text` made safe for roff: backslashes and hyphens escaped, Markdown's
/// backticks dropped, no line starting with a control character.
fn roff(text: &str) -> String {
    let escaped = text.replace('\\', "\\e").replace('-', "\\-").replace('`', "");
    if escaped.starts_with('.') || escaped.starts_with('\'') {
        format!("\\&{escaped}")
    } else {
        escaped
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// Every `table.key` path the parser accepts, found by letting serde
    /// describe [`super::super::raw::RawFile`] to a deserializer that
    /// records the fields of each struct it is asked for.
    fn parser_keys() -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        trace::keys::<super::super::raw::RawFile>(&mut keys);
        keys
    }

    fn reference_keys() -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        for table in TABLES {
            for path in std::iter::once(table.path).chain(table.also.iter().copied()) {
                for key in table.all_keys() {
                    keys.insert(format!("{path}.{}", key.name));
                }
            }
        }
        keys
    }

    #[test]
    fn every_config_key_is_in_the_reference() {
        let parser = parser_keys();
        let reference = reference_keys();
        // The tables themselves are keys of their parent; the reference
        // lists them as tables.
        let tables: BTreeSet<String> = TABLES
            .iter()
            .flat_map(|t| std::iter::once(t.path).chain(t.also.iter().copied()))
            .map(str::to_string)
            .collect();
        let missing: Vec<&String> = parser.iter().filter(|k| !reference.contains(*k) && !tables.contains(*k)).collect();
        assert!(
            missing.is_empty(),
            "config keys the reference (control/config/reference.rs) does not list: {missing:?}; add them with their type, default and meaning"
        );
        let stale: Vec<&String> = reference.iter().filter(|k| !parser.contains(*k)).collect();
        assert!(stale.is_empty(), "the reference lists keys the parser does not accept: {stale:?}");
        assert!(parser.len() > 60, "the trace found only {} keys: {parser:?}", parser.len());
    }

    #[test]
    fn documented_defaults_are_the_code_defaults() {
        let key = |table: &str, name: &str| {
            let t = TABLES.iter().find(|t| t.path == table).unwrap();
            t.all_keys().find(|k| k.name == name).unwrap().default
        };
        let defaults = crate::control::config::Dataplane::default();
        assert_eq!(key("dataplane", "pin_dir"), format!("{:?}", rocev2_common::maps::PIN_DIR));
        assert_eq!(key("dataplane", "pin_dir"), format!("{:?}", defaults.pin_dir.display().to_string()));
        assert_eq!(key("dataplane", "neighbour_refresh_ms"), defaults.neighbour_refresh.as_millis().to_string());
        assert_eq!(key("dataplane", "hash"), format!("{:?}", defaults.hash.name()));
        assert_eq!(key("group", "flowlet_gap_us"), super::super::validate::DEFAULT_FLOWLET_GAP_US.to_string());
        assert_eq!(
            key("group", "flowlet_table_size"),
            format!(
                "keyed {}; keyless {}",
                rocev2_common::maps::DEFAULT_FLOWLET_TABLE_SIZE,
                rocev2_common::maps::DEFAULT_FLOWLET_SLOTS
            )
        );
        let ta = super::super::transport_aware::TransportAware::default();
        assert_eq!(key("group.transport_aware", "demote_above"), ta.demote_above.to_string());
        assert_eq!(key("group.transport_aware", "restore_below"), ta.restore_below.to_string());
        assert_eq!(key("group.transport_aware", "half_life_ms"), ta.half_life.as_millis().to_string());
        assert_eq!(key("group.transport_aware", "nak_weight"), ta.nak_weight.to_string());
        assert_eq!(key("group.transport_aware", "retransmit_weight"), ta.retransmit_weight.to_string());
        assert_eq!(key("group.transport_aware", "cnp_weight"), ta.cnp_weight.to_string());
        assert_eq!(
            key("group.transport_aware", "repick"),
            if ta.repick_when_acked { "\"idle-or-acked\"" } else { "\"idle\"" }
        );
    }

    /// The book's page is what [`markdown`] renders; `ROCEV2_BLESS=1`
    /// rewrites it.
    #[test]
    fn the_book_page_is_generated_from_the_reference() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/config-reference.md");
        let want = markdown();
        if std::env::var_os("ROCEV2_BLESS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is not what control/config/reference.rs renders: run `ROCEV2_BLESS=1 cargo test -p rocev2-user reference` and commit the result",
            path.display()
        );
    }

    /// The man page's example and the front page's minimal config (the
    /// one the book's "Running it" includes) are files `check --offline`
    /// accepts.
    #[test]
    fn the_man_page_example_and_the_minimal_config_parse() {
        let path = std::path::Path::new("rocev2.toml");
        crate::control::config::Config::parse(EXAMPLE, path).expect("the man page's example parses");
        let readme =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
        let minimal = readme
            .split("ANCHOR: minimal")
            .nth(1)
            .and_then(|rest| rest.split("```toml\n").nth(1))
            .and_then(|rest| rest.split("```").next())
            .expect("README.md has the minimal config between its `minimal` anchors");
        crate::control::config::Config::parse(minimal, path).expect("the front page's minimal config parses");
    }

    #[test]
    fn the_man_page_names_every_key_and_escapes_roff() {
        let page = man_page("0.1.0");
        for table in TABLES {
            for key in table.all_keys() {
                assert!(page.contains(&format!("\\fB{}\\fR", roff(key.name))), "{} missing", key.name);
            }
        }
        assert!(page.lines().all(|l| !l.starts_with('\'')), "no line may start with a quote");
        assert!(!page.contains('`'));
    }

    /// A serde deserializer that answers every request with a made-up
    /// value of the requested kind and records the fields of every struct
    /// on the way, with the path of tables that led to it.
    mod trace {
        use std::collections::BTreeSet;

        use serde::de::{
            self, value::BorrowedStrDeserializer, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor,
        };

        /// toml's `Spanned<T>` is a struct of this name whose `value` field
        /// holds the real value: not a table of the file.
        const SPANNED: &str = "$__serde_spanned_private_Spanned";

        pub fn keys<'de, T: serde::Deserialize<'de>>(out: &mut BTreeSet<String>) {
            T::deserialize(Tracer { path: String::new(), out }).expect("the trace deserializes the whole file");
        }

        struct Tracer<'a> {
            path: String,
            out: &'a mut BTreeSet<String>,
        }

        #[derive(Debug)]
        struct Error(String);
        impl std::fmt::Display for Error {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl std::error::Error for Error {}
        impl de::Error for Error {
            fn custom<T: std::fmt::Display>(msg: T) -> Self {
                Error(msg.to_string())
            }
        }

        impl<'de> Deserializer<'de> for Tracer<'_> {
            type Error = Error;

            fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                // `toml::Value` and other untyped values: an integer will do.
                visitor.visit_i64(0)
            }
            fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                visitor.visit_bool(false)
            }
            fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                visitor.visit_i64(0)
            }
            fn deserialize_u64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                visitor.visit_u64(0)
            }
            fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                visitor.visit_f64(0.0)
            }
            fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                visitor.visit_str("")
            }
            fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                visitor.visit_string(String::new())
            }
            fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                visitor.visit_some(self)
            }
            fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
                visitor.visit_seq(OneElement(Some(self)))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                name: &'static str,
                fields: &'static [&'static str],
                visitor: V,
            ) -> Result<V::Value, Error> {
                if name != SPANNED {
                    for field in fields {
                        self.out.insert(join(&self.path, field));
                    }
                }
                visitor.visit_map(Fields { spanned: name == SPANNED, fields, at: 0, path: self.path, out: self.out })
            }

            serde::forward_to_deserialize_any! {
                i8 i16 i32 i128 u8 u16 u32 u128 f32 char bytes byte_buf unit unit_struct
                newtype_struct tuple tuple_struct map enum identifier ignored_any
            }
        }

        fn join(path: &str, field: &str) -> String {
            if path.is_empty() {
                field.to_string()
            } else {
                format!("{path}.{field}")
            }
        }

        /// A sequence of one made-up element (an array of tables: its
        /// fields are those of every element).
        struct OneElement<'a>(Option<Tracer<'a>>);

        impl<'de> SeqAccess<'de> for OneElement<'_> {
            type Error = Error;
            fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
                self.0.take().map(|tracer| seed.deserialize(tracer)).transpose()
            }
        }

        /// A struct's fields, each with a made-up value.
        struct Fields<'a> {
            spanned: bool,
            fields: &'static [&'static str],
            at: usize,
            path: String,
            out: &'a mut BTreeSet<String>,
        }

        impl<'de> MapAccess<'de> for Fields<'_> {
            type Error = Error;
            fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
                let Some(field) = self.fields.get(self.at) else { return Ok(None) };
                seed.deserialize(BorrowedStrDeserializer::<Error>::new(field)).map(Some)
            }
            fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
                let field = self.fields[self.at];
                self.at += 1;
                // A span's value is the value itself, at the same path.
                let path = if self.spanned { self.path.clone() } else { join(&self.path, field) };
                seed.deserialize(Tracer { path, out: self.out })
            }
        }
    }
}
