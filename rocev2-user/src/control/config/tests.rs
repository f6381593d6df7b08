use super::*;
use rocev2_common::maps::{MAX_GROUPS, MAX_MEMBERS_PER_GROUP, MAX_PORTS};

/// The example from the documentation, comments included.
const EXAMPLE: &str = r#"[dataplane]
hash = "qp"            # or "five-tuple"; default "qp"
hash_seed = 1234       # u32, default 0
xdp_mode = "native"    # or "skb"; default "native"
pin_dir = "/sys/fs/bpf/rocev2"   # optional
neighbour_refresh_ms = 1000      # optional

[[port]]
name = "eth1"          # every interface that receives traffic to forward

[[group]]
name = "spines"
hash = "five-tuple"    # optional per-group override of dataplane.hash
members = [
  { dev = "eth2", via = "10.0.2.2" },          # neighbour MAC from the kernel's table
  { dev = "eth3", via = "fd00:3::2" },
  { dev = "eth4", mac = "02:00:00:00:00:04" }, # static neighbour MAC
]

[[route]]
prefix = "10.1.0.0/16"     # IPv4 or IPv6 CIDR; a bare address means /32 or /128
group = "spines"
"#;

/// A minimal valid file of 6 lines; tests append to it, so whatever
/// they add starts on line 7.
const BASE: &str = r#"[[port]]
name = "eth1"

[[group]]
name = "spines"
members = [{ dev = "eth2", via = "10.0.2.2" }]
"#;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("lab.toml"))
}

fn parse_ok(text: &str) -> Config {
    match parse(text) {
        Ok(c) => c,
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// Asserts the message starts with `lab.toml:LINE:`, names `key` and
/// contains every needle; returns it for further checks.
fn assert_error(text: &str, line: usize, key: &str, needles: &[&str]) -> String {
    let err = match parse(text) {
        Ok(_) => panic!("expected an error about {key} on line {line}"),
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(msg.starts_with(&format!("lab.toml:{line}:")), "expected file and line {line} in: {msg}");
    assert!(msg.contains(&format!(": {key}: ")), "expected key {key} in: {msg}");
    for needle in needles {
        assert!(msg.contains(needle), "expected {needle:?} in: {msg}");
    }
    assert!(!msg.contains('\n'), "message must be one line: {msg}");
    assert_eq!(err.line(), Some(line));
    assert_eq!(err.key(), Some(key));
    msg
}

// --- valid files ---------------------------------------------------

#[test]
fn example_parses_with_all_values() {
    let c = parse_ok(EXAMPLE);
    assert_eq!(c.path, Path::new("lab.toml"));
    assert_eq!(c.dataplane.hash, HashMode::Qp);
    assert_eq!(c.dataplane.hash_seed, HashSeed::Fixed(1234));
    assert_eq!(c.dataplane.xdp_mode, XdpMode::Native);
    assert_eq!(c.dataplane.pin_dir, Path::new("/sys/fs/bpf/rocev2"));
    assert_eq!(c.dataplane.neighbour_refresh, Duration::from_millis(1000));

    assert_eq!(c.ports.len(), 1);
    assert_eq!(c.ports[0].name, "eth1");
    assert_eq!(c.ports[0].loc, Location { key: "port[0]".into(), line: 9, column: 8 });

    assert_eq!(c.groups.len(), 1);
    let g = &c.groups[0];
    assert_eq!(g.name, "spines");
    assert_eq!(g.hash, HashMode::FiveTuple, "per-group override wins");
    assert_eq!((g.loc.key.as_str(), g.loc.line, g.loc.column), ("group[0]", 11, 1));
    let hops: Vec<(&str, NextHop)> = g.members.iter().map(|m| (m.dev.as_str(), m.next_hop)).collect();
    assert_eq!(
        hops,
        vec![
            ("eth2", NextHop::Via("10.0.2.2".parse().unwrap())),
            ("eth3", NextHop::Via("fd00:3::2".parse().unwrap())),
            ("eth4", NextHop::Mac([2, 0, 0, 0, 0, 4])),
        ]
    );
    assert_eq!(g.members[1].loc, Location { key: "group[0].members[1]".into(), line: 16, column: 3 });

    assert_eq!(c.routes.len(), 1);
    let r = &c.routes[0];
    assert_eq!(r.prefix, Prefix::V4 { addr: Ipv4Addr::new(10, 1, 0, 0), len: 16 });
    assert_eq!(r.group, "spines");
    assert_eq!(r.group_index, 0);
    assert_eq!((r.loc.key.as_str(), r.loc.line), ("route[0]", 20));
}

#[test]
fn missing_keys_take_defaults() {
    let c = parse_ok(BASE);
    assert_eq!(c.dataplane, Dataplane::default());
    assert_eq!(c.dataplane.hash, HashMode::Qp);
    assert_eq!(c.dataplane.hash_seed, HashSeed::Fixed(0));
    assert_eq!(c.dataplane.xdp_mode, XdpMode::Native);
    assert_eq!(c.dataplane.pin_dir, Path::new(PIN_DIR));
    assert_eq!(c.dataplane.neighbour_refresh, Duration::from_millis(1000));
    assert_eq!(c.groups[0].hash, HashMode::Qp);
    assert!(c.routes.is_empty());
}

#[test]
fn group_inherits_dataplane_hash_and_other_values_parse() {
    let text = format!(
        "[dataplane]\nhash = \"five-tuple\"\nxdp_mode = \"skb\"\nhash_seed = 4294967295\n\
             neighbour_refresh_ms = 100\npin_dir = \"/sys/fs/bpf/other\"\n{BASE}"
    );
    let c = parse_ok(&text);
    assert_eq!(c.dataplane.hash, HashMode::FiveTuple);
    assert_eq!(c.dataplane.xdp_mode, XdpMode::Skb);
    assert_eq!(c.dataplane.hash_seed, HashSeed::Fixed(u32::MAX));
    assert_eq!(c.dataplane.neighbour_refresh, Duration::from_millis(100));
    assert_eq!(c.dataplane.pin_dir, Path::new("/sys/fs/bpf/other"));
    assert_eq!(c.groups[0].hash, HashMode::FiveTuple);
}

#[test]
fn routes_parse_v4_v6_and_bare_addresses() {
    let text = format!(
        "{BASE}[[group]]\nname = \"leaves\"\nmembers = [{{ dev = \"eth3\", mac = \"02:00:00:00:00:03\" }}]\n\
             [[route]]\nprefix = \"10.9.9.9\"\ngroup = \"leaves\"\n\
             [[route]]\nprefix = \"fd00:1::/48\"\ngroup = \"spines\"\n\
             [[route]]\nprefix = \"fd00::1\"\ngroup = \"leaves\"\n\
             [[route]]\nprefix = \"0.0.0.0/0\"\ngroup = \"spines\"\n"
    );
    let c = parse_ok(&text);
    let got: Vec<(String, u32)> = c.routes.iter().map(|r| (r.prefix.to_string(), r.group_index)).collect();
    assert_eq!(
        got,
        vec![
            ("10.9.9.9/32".to_string(), 1),
            ("fd00:1::/48".to_string(), 0),
            ("fd00::1/128".to_string(), 1),
            ("0.0.0.0/0".to_string(), 0),
        ]
    );
    assert_eq!(c.routes[2].prefix, Prefix::host("fd00::1".parse().unwrap()));
    assert_eq!(c.routes[1].prefix.prefix_len(), 48);
}

#[test]
fn prefix_display() {
    let v4 = Prefix::V4 { addr: Ipv4Addr::new(192, 168, 0, 0), len: 24 };
    assert_eq!(v4.to_string(), "192.168.0.0/24");
    let v6 = Prefix::V6 { addr: "2001:db8::".parse().unwrap(), len: 32 };
    assert_eq!(v6.to_string(), "2001:db8::/32");
}

// --- file and syntax errors ----------------------------------------

#[test]
fn unreadable_file_names_the_file() {
    let path = Path::new("/nonexistent/rocev2-test/lab.toml");
    let msg = match Config::load(path) {
        Ok(_) => panic!("loading a missing file succeeded"),
        Err(e) => e.to_string(),
    };
    assert!(msg.starts_with("/nonexistent/rocev2-test/lab.toml: cannot read: "), "{msg}");
    assert!(msg.contains("No such file"), "{msg}");
    assert!(msg.ends_with("or let `rocev2 lab up` write one for a lab"), "{msg}");
}

#[test]
fn load_reads_the_file() {
    let path = std::env::temp_dir().join(format!("rocev2-config-test-{}.toml", std::process::id()));
    std::fs::write(&path, EXAMPLE).unwrap();
    let result = Config::load(&path);
    std::fs::remove_file(&path).unwrap();
    let c = result.unwrap();
    assert_eq!(c.path, path);
    assert_eq!(c.groups[0].members.len(), 3);
}

#[test]
fn syntax_error_keeps_line_and_column() {
    // Unterminated string on line 8; toml points after its end.
    let text = format!("{BASE}[[port]]\nname = \"eth9\n");
    let msg = assert_error(&text, 8, "port[1].name", &["string"]);
    assert!(msg.starts_with("lab.toml:8:13: "), "{msg}");
    assert!(!msg.contains("double quotes"), "misleading hint: {msg}");
}

#[test]
fn syntax_error_without_key_still_has_line() {
    let text = format!("{BASE}[[route]\n");
    let err = parse(&text).unwrap_err();
    assert_eq!(err.line(), Some(7));
    assert!(err.to_string().starts_with("lab.toml:7:"), "{err}");
}

#[test]
fn unquoted_string_hints_at_quotes() {
    let text = format!("[dataplane]\nhash = qp\n{BASE}");
    assert_error(&text, 2, "dataplane.hash", &["\"qp\" or \"five-tuple\""]);
}

#[test]
fn duplicate_key_is_reported() {
    let text = format!("{BASE}[[port]]\nname = \"eth7\"\nname = \"eth8\"\n");
    assert_error(&text, 9, "port[1].name", &["duplicate key"]);
}

// --- unknown and missing keys --------------------------------------

#[test]
fn unknown_dataplane_key_lists_valid_keys() {
    let text = format!("[dataplane]\nhash = \"qp\"\nhashseed = 7\n{BASE}");
    let msg = assert_error(
        &text,
        3,
        "dataplane.hashseed",
        &[
            "unknown key `hashseed` (did you mean `hash_seed`?); valid keys here:",
            "`xdp_mode`",
            "`neighbour_refresh_ms`",
        ],
    );
    assert!(msg.starts_with("lab.toml:3:1: "), "{msg}");
}

#[test]
fn unknown_member_key_inside_inline_table() {
    let text = "[[port]]\nname = \"eth1\"\n[[group]]\nname = \"g\"\nmembers = [\n  { dev = \"eth2\", via = \"10.0.2.2\" },\n  { dev = \"eth3\", vias = \"10.0.3.2\" },\n]\n";
    assert_error(text, 7, "group[0].members[1].vias", &["unknown key `vias`", "did you mean `via`?", "`mac`"]);
}

#[test]
fn unknown_section_suggests_the_right_one() {
    let text = format!("{BASE}\n[[ports]]\nname = \"eth2\"\n");
    assert_error(&text, 8, "ports", &["did you mean `port`?", "`route`"]);
}

#[test]
fn single_bracket_section_explains_double_brackets() {
    let text = "[port]\nname = \"eth1\"\n";
    assert_error(text, 1, "port", &["expected an array", "[[port]]"]);
}

#[test]
fn unknown_key_named_like_a_section() {
    // `group` is a top-level key too; the error is about group[1]'s own.
    let text = format!("{BASE}[[group]]\nname = \"g2\"\ngroup = \"spines\"\n");
    assert_error(&text, 9, "group[1].group", &["unknown key `group`", "`members`"]);
    let text = format!("[dataplane]\nport = 1\n{BASE}");
    assert_error(&text, 2, "dataplane.port", &["unknown key `port`"]);
}

#[test]
fn unknown_key_in_sub_table_header() {
    let text = format!("{BASE}[dataplane.extra]\na = 1\n");
    assert_error(&text, 7, "dataplane.extra", &["unknown key `extra`", "`hash_seed`"]);
}

#[test]
fn syntax_error_inside_inline_table_does_not_blame_the_line_key() {
    let text = format!("{BASE}[[group]]\nname = \"g\"\nmembers = [{{ dev = \"eth3\", via = 10.0.3.2 }}]\n");
    let err = parse(&text).unwrap_err();
    assert_eq!(err.line(), Some(9));
    assert_eq!(err.key(), Some(""));
    assert!(!err.to_string().contains("members"), "{err}");
}

#[test]
fn missing_required_key() {
    let text = format!("{BASE}\n[[group]]\nname = \"leaves\"\n");
    assert_error(&text, 8, "group[1]", &["missing required key `members`"]);
}

#[test]
fn wrong_type_names_key_and_expected_type() {
    let text = format!("{BASE}[[route]]\nprefix = 10\ngroup = \"spines\"\n");
    assert_error(&text, 8, "route[0].prefix", &["expected a string", "double quotes"]);
}

// --- [dataplane] values --------------------------------------------

#[test]
fn bad_hash_lists_allowed_values() {
    let text = format!("[dataplane]\nhash = \"crc\"\n{BASE}");
    let msg = assert_error(&text, 2, "dataplane.hash", &["\"crc\"", "\"qp\"", "\"five-tuple\""]);
    assert!(msg.starts_with("lab.toml:2:8: "), "{msg}");
}

#[test]
fn hash_of_wrong_type() {
    let text = format!("[dataplane]\nhash = 5\n{BASE}");
    assert_error(&text, 2, "dataplane.hash", &["expected a string", "\"qp\" or \"five-tuple\""]);
}

#[test]
fn bad_group_hash() {
    let text = format!(
        "{BASE}[[group]]\nname = \"leaves\"\nhash = \"5tuple\"\nmembers = [{{ dev = \"eth3\", via = \"10.0.3.2\" }}]\n"
    );
    assert_error(&text, 9, "group[1].hash", &["\"5tuple\"", "\"five-tuple\""]);
}

#[test]
fn bad_xdp_mode() {
    let text = format!("[dataplane]\n\nxdp_mode = \"driver\"\n{BASE}");
    assert_error(&text, 3, "dataplane.xdp_mode", &["\"driver\"", "\"native\"", "\"skb\""]);
}

#[test]
fn hash_version_is_1_unless_the_file_says_2() {
    use rocev2_common::hash::HashVersion;
    // A config written before the key existed keeps its placement.
    assert_eq!(parse_ok(BASE).dataplane.hash_version, HashVersion::V1);
    for (n, version) in [(1, HashVersion::V1), (2, HashVersion::V2)] {
        let text = format!("[dataplane]\nhash_version = {n}\n{BASE}");
        assert_eq!(parse_ok(&text).dataplane.hash_version, version);
    }
}

#[test]
fn unknown_hash_version() {
    for bad in ["3", "0", "-1"] {
        let text = format!("[dataplane]\nhash_version = {bad}\n{BASE}");
        assert_error(&text, 2, "dataplane.hash_version", &[&format!("{bad} is not a hash version"), "use 2", "or 1"]);
    }
    let text = format!("[dataplane]\nhash_version = \"2\"\n{BASE}");
    assert_error(&text, 2, "dataplane.hash_version", &["use 1 or 2"]);
}

#[test]
fn negative_hash_seed() {
    let text = format!("[dataplane]\nhash_seed = -1\n{BASE}");
    assert_error(&text, 2, "dataplane.hash_seed", &["-1 is negative", "0 to 4294967295"]);
}

#[test]
fn hash_seed_too_big_for_u32() {
    let text = format!("[dataplane]\nhash_seed = 4294967296\n{BASE}");
    assert_error(&text, 2, "dataplane.hash_seed", &["4294967296 is too big", "0 to 4294967295"]);
}

#[test]
fn hash_seed_too_big_for_toml() {
    // Beyond i64: toml itself rejects it, we still name the key.
    let text = format!("[dataplane]\nhash_seed = 99999999999999999999\n{BASE}");
    assert_error(&text, 2, "dataplane.hash_seed", &["too large", "0 to 4294967295"]);
}

#[test]
fn hash_seed_of_wrong_type() {
    let text = format!("[dataplane]\nhash_seed = \"1234\"\n{BASE}");
    assert_error(&text, 2, "dataplane.hash_seed", &["is not a seed", "0 to 4294967295", "\"auto\""]);
}

#[test]
fn neighbour_refresh_out_of_range() {
    let low = format!("[dataplane]\nneighbour_refresh_ms = 99\n{BASE}");
    assert_error(&low, 2, "dataplane.neighbour_refresh_ms", &["99 is out of range", "100 to 60000"]);
    let high = format!("[dataplane]\n\nneighbour_refresh_ms = 60001\n{BASE}");
    assert_error(&high, 3, "dataplane.neighbour_refresh_ms", &["60001", "100 to 60000"]);
}

#[test]
fn relative_pin_dir() {
    let text = format!("[dataplane]\npin_dir = \"bpf/rocev2\"\n{BASE}");
    assert_error(&text, 2, "dataplane.pin_dir", &["not an absolute path", "/sys/fs/bpf/rocev2"]);
}

// --- ports ---------------------------------------------------------

#[test]
fn no_port_section() {
    let text = "[[group]]\nname = \"g\"\nmembers = [{ dev = \"eth2\", via = \"10.0.2.2\" }]\n";
    let err = parse(text).unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("lab.toml: port: "), "{msg}");
    assert!(msg.contains("[[port]]"), "{msg}");
    assert_eq!(err.line(), None);
}

#[test]
fn duplicate_port_names_the_first() {
    let text = format!("{BASE}[[port]]\nname = \"eth1\"\n");
    assert_error(&text, 8, "port[1].name", &["\"eth1\"", "port[0] (line 2)"]);
}

#[test]
fn bad_interface_names() {
    let long = format!("{BASE}[[port]]\nname = \"a-very-long-ifname0\"\n");
    assert_error(&long, 8, "port[1].name", &["too long", "15"]);
    let empty = format!("{BASE}[[port]]\nname = \"\"\n");
    assert_error(&empty, 8, "port[1].name", &["interface name is needed"]);
    let slash =
        "[[port]]\nname = \"eth1\"\n[[group]]\nname = \"g\"\nmembers = [{ dev = \"eth/2\", via = \"10.0.2.2\" }]\n";
    assert_error(slash, 5, "group[0].members[0].dev", &["\"eth/2\"", "not a valid interface name"]);
}

#[test]
fn too_many_ports() {
    let mut text = String::from(BASE);
    for i in 2..=MAX_PORTS {
        text.push_str(&format!("[[port]]\nname = \"eth{i}\"\n"));
    }
    // port[0] is in BASE; port[63] starts 2 * 62 lines after line 7.
    assert_error(&text, 7 + 2 * 62, "port[63]", &["too many ports", "63"]);
}

// --- groups and members --------------------------------------------

#[test]
fn member_with_both_via_and_mac() {
    let text = format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [\n  {{ dev = \"eth3\", via = \"10.0.3.2\", mac = \"02:00:00:00:00:03\" }},\n]\n");
    assert_error(&text, 10, "group[1].members[0]", &["both `via` and `mac`", "exactly one"]);
}

#[test]
fn member_with_neither_via_nor_mac() {
    let text = format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [\n  {{ dev = \"eth3\" }},\n]\n");
    assert_error(&text, 10, "group[1].members[0]", &["needs `via`", "`mac`"]);
}

#[test]
fn via_is_not_an_ip() {
    let text = format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [\n  {{ dev = \"eth3\", via = \"10.0.3\" }},\n]\n");
    let msg = assert_error(&text, 10, "group[1].members[0].via", &["\"10.0.3\" is not an IP address"]);
    // Column of the value, after `  { dev = "eth3", via = `.
    assert!(msg.starts_with("lab.toml:10:25: "), "{msg}");
    let mcast = format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [{{ dev = \"eth3\", via = \"ff02::1\" }}]\n");
    assert_error(&mcast, 9, "group[1].members[0].via", &["cannot be a next hop"]);
}

#[test]
fn malformed_mac() {
    for bad in
        ["02:00:00:00:04", "02:00:00:00:00:04:05", "02-00-00-00-00-04", "02:00:00:00:00:0g", "002:00:00:00:00:04"]
    {
        let text = format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [{{ dev = \"eth3\", mac = \"{bad}\" }}]\n");
        assert_error(&text, 9, "group[1].members[0].mac", &[&format!("{bad:?} is not a MAC address"), "six hex bytes"]);
    }
}

#[test]
fn multicast_and_broadcast_mac() {
    let mcast =
        format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [{{ dev = \"eth3\", mac = \"01:00:5e:00:00:01\" }}]\n");
    assert_error(&mcast, 9, "group[1].members[0].mac", &["multicast", "unicast"]);
    let bcast =
        format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [{{ dev = \"eth3\", mac = \"FF:FF:FF:FF:FF:FF\" }}]\n");
    assert_error(&bcast, 9, "group[1].members[0].mac", &["broadcast"]);
    let zero =
        format!("{BASE}[[group]]\nname = \"g2\"\nmembers = [{{ dev = \"eth3\", mac = \"00:00:00:00:00:00\" }}]\n");
    assert_error(&zero, 9, "group[1].members[0].mac", &["all zeros"]);
}

#[test]
fn duplicate_group_name_names_the_first() {
    let text = format!("{BASE}[[group]]\nname = \"spines\"\nmembers = [{{ dev = \"eth3\", via = \"10.0.3.2\" }}]\n");
    assert_error(&text, 8, "group[1].name", &["\"spines\" already exists", "group[0], line 4", "unique"]);
}

#[test]
fn empty_group_name() {
    let text = format!("{BASE}[[group]]\nname = \" \"\nmembers = [{{ dev = \"eth3\", via = \"10.0.3.2\" }}]\n");
    assert_error(&text, 8, "group[1].name", &["needs a name"]);
}

#[test]
fn group_without_members() {
    let text = format!("{BASE}[[group]]\nname = \"g2\"\nmembers = []\n");
    let msg = assert_error(&text, 9, "group[1].members", &["at least one member"]);
    assert!(msg.starts_with("lab.toml:9:11: "), "{msg}");
}

#[test]
fn group_with_too_many_members() {
    let mut text = format!("{BASE}[[group]]\nname = \"big\"\nmembers = [\n");
    for i in 0..=MAX_MEMBERS_PER_GROUP {
        text.push_str(&format!("  {{ dev = \"eth2\", via = \"10.0.{}.{}\" }},\n", i / 200, i % 200 + 1));
    }
    text.push_str("]\n");
    // members[0] is on line 10, members[128] 128 lines later.
    assert_error(&text, 10 + 128, "group[1].members[128]", &["too many members", "128"]);
}

#[test]
fn too_many_groups() {
    let mut text = String::from("[[port]]\nname = \"eth1\"\n");
    for i in 0..=MAX_GROUPS {
        text.push_str(&format!("[[group]]\nname = \"g{i}\"\nmembers = [{{ dev = \"eth2\", via = \"10.0.2.2\" }}]\n"));
    }
    // group[i] starts on line 3 + 3 * i.
    assert_error(&text, 3 + 3 * 256, "group[256]", &["too many groups", "256"]);
}

// --- routes --------------------------------------------------------

#[test]
fn host_bits_set_suggests_masked_prefix() {
    let text = format!(
        "{BASE}[[route]]\nprefix = \"10.2.0.0/16\"\ngroup = \"spines\"\n\
             [[route]]\nprefix = \"10.3.0.0/16\"\ngroup = \"spines\"\n\
             [[route]]\nprefix = \"10.1.0.1/16\"\ngroup = \"spines\"\n"
    );
    let err = parse(&text).unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"lab.toml:14:10: route[2].prefix: "10.1.0.1/16" has host bits set; did you mean "10.1.0.0/16"?"#
    );
    let v6 = format!("{BASE}[[route]]\nprefix = \"fd00:1::1/64\"\ngroup = \"spines\"\n");
    assert_error(&v6, 8, "route[0].prefix", &["host bits", "did you mean \"fd00:1::/64\"?"]);
}

#[test]
fn invalid_prefixes() {
    let cases = [
        ("10.1.0.0/33", "prefix length \"33\" is not valid for IPv4; use 0 to 32"),
        ("fd00::/129", "prefix length \"129\" is not valid for IPv6; use 0 to 128"),
        ("10.1.0.0/", "prefix length \"\""),
        ("10.1.0.0/-1", "prefix length \"-1\""),
        ("10.1.0/16", "is not an IP prefix"),
        ("spines", "is not an IP prefix"),
    ];
    for (prefix, needle) in cases {
        let text = format!("{BASE}\n[[route]]\nprefix = \"{prefix}\"\ngroup = \"spines\"\n");
        assert_error(&text, 9, "route[0].prefix", &[needle]);
    }
}

#[test]
fn route_to_unknown_group_lists_groups() {
    let text = format!(
        "{BASE}[[group]]\nname = \"leaves\"\nmembers = [{{ dev = \"eth3\", via = \"10.0.3.2\" }}]\n\
             [[route]]\nprefix = \"10.1.0.0/16\"\ngroup = \"spine\"\n"
    );
    assert_error(&text, 12, "route[0].group", &["no group named \"spine\"", "\"spines\", \"leaves\""]);
}

#[test]
fn route_without_any_group() {
    let text = "[[port]]\nname = \"eth1\"\n[[route]]\nprefix = \"10.1.0.0/16\"\ngroup = \"spines\"\n";
    assert_error(text, 5, "route[0].group", &["no [[group]] is defined"]);
}

#[test]
fn duplicate_route_names_the_first() {
    let text = format!(
        "{BASE}[[route]]\nprefix = \"fd00::/16\"\ngroup = \"spines\"\n\
             [[route]]\nprefix = \"10.1.0.0/16\"\ngroup = \"spines\"\n\
             [[route]]\nprefix = \"fd00:0::/16\"\ngroup = \"spines\"\n"
    );
    assert_error(&text, 14, "route[2].prefix", &["fd00::/16 is already routed by route[0] (line 7)"]);
}

// --- helpers -------------------------------------------------------

#[test]
fn error_at_formats_runtime_errors() {
    let c = parse_ok(EXAMPLE);
    let e = c.error_at(&c.ports[0].loc, "name", "no interface named eth1");
    assert_eq!(e.to_string(), "lab.toml:9:8: port[0].name: no interface named eth1");
    let e = c.error_at(&c.groups[0].members[2].loc, "", "neighbour unreachable");
    assert_eq!(e.to_string(), "lab.toml:17:3: group[0].members[2]: neighbour unreachable");
}

#[test]
fn line_col_counts_characters() {
    let text = "a\n\u{e9}\u{e9}x\n";
    assert_eq!(line_col(text, 0), (1, 1));
    assert_eq!(line_col(text, 2), (2, 1));
    // 'x' is at byte 6 (two 2-byte characters before it) but column 3.
    assert_eq!(line_col(text, 6), (2, 3));
    // Past the end and inside a character stay in bounds.
    assert_eq!(line_col(text, 100), (3, 1));
    assert_eq!(line_col(text, 3), (2, 1));
}

#[test]
fn a_key_without_its_unit_gets_did_you_mean() {
    let text = "[[port]]\nname = \"eth1\"\n\n[[group]]\nname = \"spines\"\npolicy = \"flowlet\"\nflowlet_gap = 500\nmembers = [{ dev = \"eth2\", mac = \"02:00:00:00:00:02\" }]\n";
    assert_error(text, 7, "group[0].flowlet_gap", &["unknown key `flowlet_gap` (did you mean `flowlet_gap_us`?)"]);
}

// --- issue 3: policies, pins, ECN, egress, classes -----------------

const QOS: &str = r#"[[port]]
name = "eth1"

[[group]]
name = "spines"
policy = "flowlet"
flowlet_gap_us = 16
flowlet_choice = "least-loaded"
flowlet_boundary = true
flowlet_table_size = 2048
members = [{ dev = "eth2", via = "10.0.2.2" }, { dev = "eth3", mac = "02:00:00:00:00:03" }]

[[group]]
name = "te"
policy = "pinned"
members = [{ dev = "eth2", via = "10.0.2.2" }, { dev = "eth3", mac = "02:00:00:00:00:03" }]

[[pin]]
prefix = "10.1.0.7"
qp = 0x123
group = "te"
member = "eth3"

[[ecn_profile]]
name = "lossless"
kmin = "1MiB"
kmax = "2MiB"
pmax = "5%"

[[egress]]
dev = "eth2"
rate = "25Gbit"
ecn_profile = "lossless"
local = true

[[class]]
name = "control"
opcodes = [0x11, 0x81]
set_dscp = 48
priority = "1:10"
ecn_exempt = true

[[class]]
name = "cts"
opcodes = [0x0B]
max_payload = 64
qps = "0x100-0x1ff"
dscp = [26]
ecn_profile = "lossless"
"#;

#[test]
fn qos_keys_parse_with_units() {
    let c = parse_ok(QOS);
    let Policy::Flowlet(f) = c.groups[0].policy else { panic!("flowlet policy") };
    assert_eq!(f.gap, Duration::from_micros(16));
    assert_eq!(f.choice, rocev2_common::flowlet::FlowletChoice::LeastLoaded);
    assert!(f.at_message_boundary);
    assert_eq!(c.flowlet_table_size(), 2048);
    assert_eq!(c.groups[1].policy, Policy::Pinned);
    assert_eq!((c.pins[0].qp, c.pins[0].group_index, c.pins[0].member_index), (0x123, 1, 1));
    assert_eq!(c.pins[0].prefix.to_string(), "10.1.0.7/32");
    let p = &c.ecn_profiles[0];
    assert_eq!((p.kmin_bytes, p.kmax_bytes), (1 << 20, 2 << 20));
    assert!((p.pmax - 0.05).abs() < 1e-9);
    assert_eq!(c.egress[0].rate_bytes_per_sec, 25_000_000_000 / 8);
    assert!(c.egress[0].local);
    let entries = c.class_entries();
    assert_eq!(entries[0].priority, 0x10010);
    assert_eq!(entries[0].set_dscp, 48);
    assert_eq!((entries[1].qp_min, entries[1].qp_max, entries[1].max_payload), (0x100, 0x1FF, 64));
}

#[test]
fn no_classes_means_the_default_control_class() {
    let c = parse_ok(BASE);
    assert_eq!(c.classes.len(), 1);
    assert_eq!(c.classes[0].name, "control");
    assert_eq!(c.classes[0].opcodes, vec![0x11, 0x81]);
    assert!(c.classes[0].ecn_exempt);
    assert_eq!(c.flowlet_table_size(), 1);
    // An explicit empty list turns classes off.
    assert!(parse_ok(&format!("class = []\n{BASE}")).classes.is_empty());
}

#[test]
fn bad_policy_names_the_choices() {
    let text = BASE.replace("name = \"spines\"\n", "name = \"spines\"\npolicy = \"random\"\n");
    assert_error(&text, 6, "group[0].policy", &["\"hash\"", "\"flowlet\"", "\"pinned\""]);
}

#[test]
fn flowlet_keys_need_the_flowlet_policy() {
    let text = BASE.replace("name = \"spines\"\n", "name = \"spines\"\nflowlet_gap_us = 10\n");
    assert_error(&text, 6, "group[0].flowlet_gap_us", &["policy = \"flowlet\""]);
}

#[test]
fn keyless_flowlet_table_rounds_its_slots_up_and_sizes_no_lru_share() {
    let text = QOS.replace("flowlet_table_size = 2048\n", "flowlet_table_size = 3000\nflowlet_table = \"keyless\"\n");
    let c = parse_ok(&text);
    let Policy::Flowlet(f) = c.groups[0].policy else { panic!("flowlet policy") };
    assert_eq!(f.table, rocev2_common::flowlet::FlowletTable::Keyless);
    assert_eq!(f.table_size, 4096, "rounded up to a power of two");
    assert_eq!(c.flowlet_slots(), 4096);
    assert_eq!(c.flowlet_table_size(), 1, "no keyed table needed");
    let default = parse_ok(&QOS.replace("flowlet_table_size = 2048\n", "flowlet_table = \"keyless\"\n"));
    assert_eq!(default.flowlet_slots(), rocev2_common::maps::DEFAULT_FLOWLET_SLOTS);
    let keyed = parse_ok(QOS);
    assert_eq!(keyed.flowlet_slots(), 1);
    let Policy::Flowlet(f) = keyed.groups[0].policy else { panic!("flowlet policy") };
    assert_eq!(f.table, rocev2_common::flowlet::FlowletTable::Keyed);
}

#[test]
fn flowlet_table_errors_name_the_key_and_the_choices() {
    let text = QOS.replace("flowlet_table_size = 2048\n", "flowlet_table_size = 2048\nflowlet_table = \"direct\"\n");
    assert_error(
        &text,
        11,
        "group[0].flowlet_table",
        &["\"direct\" is not a flowlet table", "\"keyed\"", "\"keyless\""],
    );
    let text = QOS.replace("flowlet_table_size = 2048\n", "flowlet_table_size = 0\nflowlet_table = \"keyless\"\n");
    assert_error(&text, 10, "group[0].flowlet_table_size", &["1 to 1048576 slots"]);
    let text = BASE.replace("name = \"spines\"\n", "name = \"spines\"\nflowlet_table = \"keyless\"\n");
    assert_error(&text, 6, "group[0].flowlet_table", &["policy = \"flowlet\""]);
}

#[test]
fn pin_into_a_hash_group_is_refused() {
    let text = format!("{BASE}\n[[pin]]\nprefix = \"10.1.0.0/16\"\nqp = 5\ngroup = \"spines\"\nmember = \"eth2\"\n");
    assert_error(&text, 11, "pin[0].group", &["policy = \"pinned\""]);
}

#[test]
fn pin_qp_must_be_24_bits() {
    let text = QOS.replace("qp = 0x123", "qp = 0x1000000");
    assert_error(&text, 20, "pin[0].qp", &["24-bit"]);
}

#[test]
fn ecn_profile_kmax_above_kmin_and_units() {
    let text = QOS.replace("kmax = \"2MiB\"", "kmax = \"1MiB\"");
    assert_error(&text, 27, "ecn_profile[0].kmax", &["must be above kmin"]);
    let text = QOS.replace("kmin = \"1MiB\"", "kmin = \"1 parsec\"");
    assert_error(&text, 26, "ecn_profile[0].kmin", &["not a size unit"]);
    let text = QOS.replace("pmax = \"5%\"", "pmax = 1.5");
    assert_error(&text, 28, "ecn_profile[0].pmax", &["0 to 1"]);
}

#[test]
fn egress_rate_and_profile_are_checked() {
    let text = QOS.replace("rate = \"25Gbit\"", "rate = \"fast\"");
    assert_error(&text, 32, "egress[0].rate", &["not a rate"]);
    let text = QOS.replace("ecn_profile = \"lossless\"\nlocal", "ecn_profile = \"lossy\"\nlocal");
    assert_error(&text, 33, "egress[0].ecn_profile", &["no ECN profile named \"lossy\"", "\"lossless\""]);
}

#[test]
fn class_values_are_checked() {
    let text = QOS.replace("set_dscp = 48", "set_dscp = 64");
    assert_error(&text, 39, "class[0].set_dscp", &["0 to 63"]);
    let text = QOS.replace("priority = \"1:10\"", "priority = \"high\"");
    assert_error(&text, 40, "class[0].priority", &["tc class id"]);
    let text = QOS.replace("qps = \"0x100-0x1ff\"", "qps = \"0x200-0x100\"");
    assert_error(&text, 47, "class[1].qps", &["after it ends"]);
}

// --- kernel routes, buckets and seeds -------------------------------

#[test]
fn kernel_routing_policies_and_learned_pins() {
    let text = "[dataplane]\nhash_seed = \"auto\"\n\n[routing]\nsource = \"kernel\"\ntable = 100\n\n[[port]]\nname = \"eth1\"\n\n\
                    [[route_policy]]\nprefix = \"10.0.0.0/8\"\npolicy = \"flowlet\"\nflowlet_gap_us = 100\nrebalance = \"gradual\"\n\n\
                    [[route_policy]]\nprefix = \"10.9.0.0/16\"\npolicy = \"pinned\"\nhash = \"five-tuple\"\n\n\
                    [[pin]]\nprefix = \"10.9.0.7/32\"\nqp = 42\nmember = \"swp52\"\n\n\
                    [[pin]]\nprefix = \"10.9.0.0/16\"\nqp = 43\nmember = \"10.100.33.2\"\n";
    let c = parse_ok(text);
    assert_eq!(c.dataplane.hash_seed, HashSeed::Auto);
    assert_eq!(c.routing.kernel_table, Some(KernelTable::Id(100)));
    assert_eq!(c.route_policies.len(), 2);
    assert!(matches!(c.route_policies[0].policy, Policy::Flowlet(f) if f.gap == Duration::from_micros(100)));
    assert_eq!(c.route_policies[0].rebalance, Rebalance::Gradual(GRADUAL_BUCKETS_PER_STEP));
    assert_eq!((c.route_policies[1].policy, c.route_policies[1].hash), (Policy::Pinned, HashMode::FiveTuple));
    assert_eq!(c.learned_pins[0].member, PinMember::Dev("swp52".into()));
    assert_eq!(c.learned_pins[1].member, PinMember::Via("10.100.33.2".parse().unwrap()));
    assert!(c.groups.is_empty() && c.routes.is_empty());
}

#[test]
fn kernel_routing_mistakes_are_named() {
    assert_error(&format!("[routing]\ntable = \"main\"\n{BASE}"), 2, "routing.table", &["source = \"kernel\""]);
    assert_error(&format!("[routing]\nsource = \"bgp\"\n{BASE}"), 2, "routing.source", &["\"kernel\"", "\"config\""]);
    assert_error(
        &format!("[routing]\nsource = \"kernel\"\ntable = 255\n{BASE}"),
        3,
        "routing.table",
        &["not 255: the local table"],
    );
    let no_group = format!("{BASE}\n[[pin]]\nprefix = \"10.9.0.7/32\"\nqp = 42\nmember = \"eth2\"\n");
    assert_error(&no_group, 8, "pin[0].group", &["source = \"kernel\""]);
    let dup = "[routing]\nsource = \"kernel\"\n[[port]]\nname = \"eth1\"\n[[route_policy]]\nprefix = \"10.0.0.0/8\"\n[[route_policy]]\nprefix = \"10.0.0.0/8\"\n";
    assert_error(dup, 8, "route_policy[1].prefix", &["already has a policy", "line 5"]);
}

#[test]
fn member_weights_and_rebalance() {
    let text = "[[port]]\nname = \"eth1\"\n\n[[group]]\nname = \"spines\"\nrebalance = \"gradual\"\nmembers = [{ dev = \"eth2\", via = \"10.0.2.2\", weight = 3 }, { dev = \"eth3\", via = \"10.0.3.2\" }]\n";
    let c = parse_ok(text);
    assert_eq!(c.groups[0].members.iter().map(|m| m.weight).collect::<Vec<_>>(), vec![3, 1]);
    assert_eq!(c.groups[0].rebalance, Rebalance::Gradual(GRADUAL_BUCKETS_PER_STEP));
    let zero = text.replace("weight = 3", "weight = 0");
    assert_error(&zero, 7, "group[0].members[0].weight", &["1 to 65535"]);
    let bad = text.replace("\"gradual\"", "\"slow\"");
    assert_error(&bad, 6, "group[0].rebalance", &["\"immediate\"", "\"gradual\""]);
}

#[test]
fn features_are_what_the_config_uses() {
    use rocev2_common::features::Features;
    // The base config: hash groups, the built-in control class, no egress.
    assert_eq!(parse_ok(BASE).features(), Features::COUNTERS.with(Features::CLASSES));
    assert_eq!(parse_ok(&format!("class = []\n{BASE}")).features(), Features::COUNTERS);
    // Keyed flowlet and pinned groups, an egress queue and classes.
    let qos = Features::ALL.without(Features::TELEMETRY).without(Features::ACKED_REPICK);
    assert_eq!(parse_ok(QOS).features(), qos.without(Features::FLOWLET_KEYLESS));
    // Only the table kind the flowlet groups use is loaded.
    let keyless = parse_ok(&QOS.replace("flowlet_table_size = 2048\n", "flowlet_table = \"keyless\"\n"));
    assert_eq!(keyless.features(), qos.without(Features::FLOWLET_KEYED));
    // A [[route_policy]] counts like a group.
    let routes = "class = []\n[routing]\nsource = \"kernel\"\n[[port]]\nname = \"eth1\"\n\
                  [[route_policy]]\nprefix = \"10.0.0.0/8\"\npolicy = \"flowlet\"\nflowlet_table = \"keyless\"\n";
    assert_eq!(parse_ok(routes).features(), Features::COUNTERS.with(Features::FLOWLET_KEYLESS));
    let both = routes.replace(
        "[[route_policy]]",
        "[[route_policy]]\nprefix = \"10.1.0.0/16\"\npolicy = \"flowlet\"\n[[route_policy]]",
    );
    assert_eq!(parse_ok(&both).features(), Features::COUNTERS.with(Features::FLOWLET));
}

// --- host bridge mode -----------------------------------------------

/// A host bridge config without routed ports: 8 lines.
const BRIDGE: &str = r#"[bridge]
name = "br0"

[[uplink_group]]
name = "gateways"
ports = ["u1", "u2", "u3", "u4"]
macs = ["02:00:5e:00:01:01"]
hash = "qp"
"#;

#[test]
fn a_bridge_with_an_uplink_group_needs_no_port() {
    let c = parse_ok(BRIDGE);
    assert!(c.ports.is_empty());
    let bridge = c.bridge.as_ref().unwrap();
    assert_eq!((bridge.name.as_str(), bridge.loc.line), ("br0", 2));
    let uplink = &bridge.uplinks[0];
    assert_eq!(uplink.macs, UplinkMacs::Listed(vec![[2, 0, 0x5e, 0, 1, 1]]));
    let group = &c.groups[uplink.group_index];
    assert!(group.is_uplink());
    assert_eq!(group.members.iter().map(|m| m.dev.as_str()).collect::<Vec<_>>(), ["u1", "u2", "u3", "u4"]);
    assert_eq!(group.members[2].loc.key, "uplink_group[0].ports[2]");
    // The policy keys are a group's.
    let flowlet = BRIDGE.replace("hash = \"qp\"", "policy = \"flowlet\"\nflowlet_gap_us = 200");
    let c = parse_ok(&flowlet);
    assert!(matches!(c.groups[0].policy, Policy::Flowlet(f) if f.gap == Duration::from_micros(200)));
    assert!(c.features().contains(Features::FLOWLET_KEYED));
    let learned = BRIDGE.replace("macs = [\"02:00:5e:00:01:01\"]", "macs = \"learned\"");
    assert_eq!(parse_ok(&learned).bridge.unwrap().uplinks[0].macs, UplinkMacs::Learned);
    // Routed ports and groups next to the bridge.
    let both = parse_ok(&format!("{BASE}{BRIDGE}"));
    assert_eq!((both.ports.len(), both.groups.len()), (1, 2));
}

#[test]
fn uplink_group_mistakes_are_named() {
    assert_error(
        &BRIDGE.replace("[\"u1\", \"u2\", \"u3\", \"u4\"]", "[\"u1\"]"),
        6,
        "uplink_group[0].ports",
        &["at least two bridge ports"],
    );
    assert_error(&BRIDGE.replace("[bridge]\nname = \"br0\"\n", ""), 2, "uplink_group[0]", &["add a [bridge] section"]);
    assert_error(&BRIDGE.replace("02:00:5e", "01:00:5e"), 7, "uplink_group[0].macs[0]", &["multicast"]);
    assert_error(&BRIDGE.replace("[\"02:00:5e:00:01:01\"]", "[]"), 7, "uplink_group[0].macs", &["is empty"]);
    assert_error(&BRIDGE.replace("[\"02:00:5e:00:01:01\"]", "\"all\""), 7, "uplink_group[0].macs", &["\"learned\""]);
    assert_error(&BRIDGE.replace("\"u2\", \"u3\"", "\"u2\", \"u2\""), 6, "uplink_group[0].ports[2]", &["listed twice"]);
    let two = format!(
        "{BRIDGE}\n[[uplink_group]]\nname = \"more\"\nports = [\"u4\", \"u5\"]\nmacs = [\"02:00:5e:00:01:02\"]\n"
    );
    assert_error(&two, 12, "uplink_group[1].ports[0]", &["already a port of uplink group \"gateways\""]);
    let same_mac = two.replace("[\"u4\", \"u5\"]", "[\"u5\", \"u6\"]").replace("01:02", "01:01");
    assert_error(&same_mac, 13, "uplink_group[1].macs[0]", &["already in uplink group \"gateways\""]);
    let route = format!("{BASE}{BRIDGE}\n[[route]]\nprefix = \"10.0.0.0/8\"\ngroup = \"gateways\"\n");
    assert_error(&route, 18, "route[0].group", &["[[uplink_group]]", "[[group]] of next hops"]);
    assert_error(&format!("[dataplane]\nattach = \"tc\"\n{BRIDGE}"), 3, "bridge", &["runs in XDP"]);
    assert_error(&format!("[dataplane]\ncpu_spread = \"qp\"\n{BRIDGE}"), 3, "bridge", &["cpu_spread"]);
    let clash = format!("{BASE}{BRIDGE}").replace("name = \"gateways\"", "name = \"spines\"");
    assert_error(&clash, 11, "uplink_group[0].name", &["already exists"]);
}

#[test]
fn odd_but_valid_configs_get_warnings() {
    assert_eq!(parse_ok(EXAMPLE).warnings, Vec::<String>::new());
    let config = parse_ok(&format!(
        "{BASE}\n[[group]]\nname = \"spare\"\nmembers = [{{ dev = \"eth3\", via = \"10.0.3.2\" }}]\n\n[[route]]\nprefix = \"10.1.0.0\"\ngroup = \"spines\"\n\n[[route]]\nprefix = \"::ffff:10.2.0.0/112\"\ngroup = \"spines\"\n"
    ));
    assert_eq!(
        config.warnings,
        vec![
            "lab.toml:13:10: route[0].prefix: \"10.1.0.0\" has no length, so it routes that one address; write \"10.1.0.0/32\" if that is meant, or the subnet's length (e.g. \"10.1.0.0/16\")",
            "lab.toml:17:10: route[1].prefix: \"::ffff:10.2.0.0/112\" is an IPv4-mapped IPv6 prefix, which no packet carries (IPv4 packets are routed by IPv4 prefixes): write an IPv4 prefix, e.g. \"10.2.0.0/16\"",
            "lab.toml:8:1: group[1]: no [[route]] uses group \"spare\", so it carries no traffic; add a route or remove the group",
        ]
    );
}
