//! What a running `rocev2 run` publishes about itself beside its pinned
//! maps: port and member names for `rocev2 stats`, and a lock so two
//! instances never share one pin directory.

use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};
use rocev2_common::flowlet::FlowletChoice;
use serde::{Deserialize, Serialize};

use crate::{control::errors::RefusalReason, sys::paths::RUN_DIR};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunState {
    pub pid: u32,
    pub config: PathBuf,
    pub netns: Option<String>,
    /// The pin directory this state describes (empty in a state file
    /// written before it was recorded).
    #[serde(default)]
    pub pin_dir: PathBuf,
    /// When this `rocev2 run` started (seconds since the epoch).
    #[serde(default)]
    pub started_at: u64,
    /// When it handed over (SIGUSR1) and left the dataplane to the next
    /// run, if it did (seconds since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handed_over_at: Option<u64>,
    /// The cookie of the network namespace it forwards in: tells ports
    /// of the same ifindex in two namespaces apart.
    #[serde(default)]
    pub netns_cookie: u64,
    /// The features the running programs were loaded with (the bits of
    /// rocev2_common::features::Features), so `check` can tell whether a
    /// reload can apply a config.
    #[serde(default)]
    pub features: u32,
    pub ports: Vec<PortState>,
    pub groups: Vec<GroupState>,
    /// `[[egress]]` ports with a virtual queue, by counter slot.
    #[serde(default)]
    pub egress: Vec<EgressState>,
    /// Class names in CLASSES order.
    #[serde(default)]
    pub classes: Vec<String>,
    /// Reloads (SIGHUP) handled so far, and how the last one went, for
    /// `rocev2 reload` to report.
    #[serde(default)]
    pub reloads: u64,
    #[serde(default)]
    pub last_reload: ReloadOutcome,
    /// Reloads that failed (the running config stayed).
    #[serde(default)]
    pub reload_failures: u64,
    /// When the running config was applied: the start or the last good
    /// reload (seconds since the epoch).
    #[serde(default)]
    pub config_loaded_at: u64,
    /// The hash seed in use, and whether it was derived (`hash_seed = "auto"`).
    #[serde(default)]
    pub seed: u32,
    #[serde(default)]
    pub seed_auto: bool,
    /// With `[routing] source = "kernel"`: what was learned from the kernel.
    #[serde(default)]
    pub learned: Option<LearnedStats>,
    /// Every device redirects go to (group members' links), by ifindex:
    /// names for the refused-redirect counters.
    #[serde(default)]
    pub egress_devices: std::collections::BTreeMap<u32, String>,
    /// Why frames an egress device refuses after a redirect are not
    /// counted (no kernel BTF, a tracepoint that would not attach); empty
    /// when they are.
    #[serde(default)]
    pub refusals_uncounted: String,
    /// With `[bridge]`: the bridge mirror's counts.
    #[serde(default)]
    pub bridge: Option<BridgeStats>,
}

/// The bridge mirror of a run with `[bridge]` (control::bridge): counts for
/// `stats` and the metrics.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct BridgeStats {
    pub bridge: String,
    /// Ports of the bridge, and how many of them forward.
    pub ports: usize,
    pub forwarding: usize,
    /// FDB map entries by kind: port, uplink, local, kernel.
    pub fdb_port: usize,
    pub fdb_uplink: usize,
    pub fdb_local: usize,
    pub fdb_kernel: usize,
    /// FDB entries of another VLAN than 0 (a VLAN-aware bridge): not served.
    pub other_vlans: usize,
    /// Netlink messages applied, full re-reads after the socket
    /// overflowed (the first read at start is not counted).
    pub messages: u64,
    pub resyncs: u64,
    /// Kernel FDB entries refreshed for hosts XDP forwarded from.
    pub ageing_refreshes: u64,
    /// The bridge's ageing time, in seconds.
    pub ageing_s: u64,
}

impl BridgeStats {
    /// One line for `stats` and the log.
    pub fn describe(&self) -> String {
        let mut line = format!(
            "bridge {}: {} ports ({} forwarding), FDB {} entries ({} to a port, {} to an uplink group, {} local, {} left to the kernel), ageing {} s, {} refreshed for hosts XDP forwards from; {} messages, {} resyncs",
            self.bridge,
            self.ports,
            self.forwarding,
            self.fdb_port + self.fdb_uplink + self.fdb_local + self.fdb_kernel,
            self.fdb_port,
            self.fdb_uplink,
            self.fdb_local,
            self.fdb_kernel,
            self.ageing_s,
            self.ageing_refreshes,
            self.messages,
            self.resyncs
        );
        if self.other_vlans > 0 {
            line.push_str(&format!("; {} entries of other VLANs not served (VLAN filtering)", self.other_vlans));
        }
        line
    }
}

/// What a run learned from the kernel's routes: counts for `stats` and
/// the metrics.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct LearnedStats {
    /// The kernel table followed.
    pub table: u32,
    /// Prefixes forwarded in XDP over learned groups (host entries included).
    pub routes: usize,
    /// Of those, host entries made from the neighbour table.
    pub hosts: usize,
    /// Prefixes left to the kernel, by reason.
    pub to_kernel: std::collections::BTreeMap<String, usize>,
    /// Learned groups.
    pub groups: usize,
    /// Netlink messages applied.
    pub messages: u64,
    /// Full re-reads of the kernel's tables after the socket overflowed
    /// (the first read at start is not counted).
    pub resyncs: u64,
    /// Time the last batch of changes took from its first message read to
    /// the dataplane updated, in microseconds.
    pub last_apply_us: u64,
    /// Median and 99th percentile of that time over the last 1,000 batches
    /// that changed a route or a group, and how many there were.
    pub apply_us_p50: u64,
    pub apply_us_p99: u64,
    pub apply_samples: u64,
    /// With `[bridge]`: the bridge mirror's counts.
    #[serde(default)]
    pub bridge: Option<BridgeStats>,
}

impl LearnedStats {
    /// One line for `stats`.
    pub fn describe(&self) -> String {
        let to_kernel: Vec<String> = self.to_kernel.iter().map(|(k, v)| format!("{k} {v}")).collect();
        format!(
            "kernel table {}: {} prefixes forwarded ({} host entries), {} learned groups, to the kernel: {}; {} messages, {} resyncs, {}",
            self.table,
            self.routes,
            self.hosts,
            self.groups,
            if to_kernel.is_empty() { "none".to_string() } else { to_kernel.join(", ") },
            self.messages,
            self.resyncs,
            if self.apply_samples == 0 {
                "no changes applied since the start".to_string()
            } else {
                format!("apply p50 {} us p99 {} us", self.apply_us_p50, self.apply_us_p99)
            }
        )
    }
}

/// How the last reload went. Written as `{"outcome": "applied"}` or
/// `{"outcome": "refused", "reason": "config", "message": "..."}`; a state
/// file a `rocev2 run` from before wrote (a string: `"ok"` or the message)
/// reads as `Applied`, or `Refused` for an `Unknown` reason.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum ReloadOutcome {
    /// No reload yet.
    #[default]
    None,
    Applied,
    /// Refused: the running config stays.
    Refused {
        reason: RefusalReason,
        message: String,
    },
}

impl<'de> Deserialize<'de> for ReloadOutcome {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(tag = "outcome", rename_all = "kebab-case")]
        enum Tagged {
            None,
            Applied,
            Refused { reason: RefusalReason, message: String },
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Tagged(Tagged),
            /// Before reasons were recorded.
            Text(String),
        }
        Ok(match Written::deserialize(d)? {
            Written::Tagged(Tagged::None) => ReloadOutcome::None,
            Written::Tagged(Tagged::Applied) => ReloadOutcome::Applied,
            Written::Tagged(Tagged::Refused { reason, message }) => ReloadOutcome::Refused { reason, message },
            Written::Text(text) if text.is_empty() => ReloadOutcome::None,
            Written::Text(text) if text == "ok" => ReloadOutcome::Applied,
            Written::Text(message) => ReloadOutcome::Refused { reason: RefusalReason::Unknown, message },
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EgressState {
    pub name: String,
    pub slot: u32,
    pub rate_bytes_per_sec: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortState {
    pub name: String,
    pub ifindex: u32,
    pub slot: u32,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GroupState {
    pub name: String,
    pub index: u32,
    pub hash: String,
    /// "hash", "flowlet" or "pinned"; empty in a state file written before
    /// the policy was recorded (shown as plain hashing).
    #[serde(default)]
    pub policy: String,
    /// A flowlet group's knobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flowlet: Option<FlowletKnobs>,
    /// A `transport_aware` group's knobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport_aware: Option<TransportAwareKnobs>,
    /// Members in position order, as live in the dataplane.
    pub members: Vec<MemberState>,
    /// Every configured member, usable or not, in config order (for
    /// `rocev2_member_up`: which member left, not only how many are left).
    #[serde(default)]
    pub configured: Vec<ConfiguredMember>,
}

/// A member as configured, and whether it is in its group now.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ConfiguredMember {
    pub dev: String,
    pub next_hop: String,
    pub up: bool,
}

/// The `flowlet_*` settings of a flowlet group, as in the config.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowletKnobs {
    pub gap_us: u64,
    pub choice: FlowletChoice,
    /// `flowlet_boundary`: move only after a packet that ends a message.
    pub boundary: bool,
    pub table_size: u32,
    /// `flowlet_table`: keyed (LRU) or keyless (slot array); keyed in a
    /// state file written before the choice existed.
    #[serde(default)]
    pub table: rocev2_common::flowlet::FlowletTable,
}

/// A group's `transport_aware` settings, as in the config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransportAwareKnobs {
    pub demote_above: f64,
    pub restore_below: f64,
    pub half_life_ms: u64,
    /// "idle" or "idle-or-acked".
    pub repick: String,
}

impl TransportAwareKnobs {
    pub fn of(t: &crate::control::config::TransportAware) -> Self {
        Self {
            demote_above: t.demote_above,
            restore_below: t.restore_below,
            half_life_ms: t.half_life.as_millis() as u64,
            repick: if t.repick_when_acked { "idle-or-acked" } else { "idle" }.into(),
        }
    }

    /// `transport-aware: demote > 10, restore < 1, half-life 1000ms`.
    pub fn describe(&self) -> String {
        let repick = if self.repick == "idle" { String::new() } else { format!(", re-pick {}", self.repick) };
        format!(
            "transport-aware: demote > {}, restore < {}, half-life {}ms{repick}",
            self.demote_above, self.restore_below, self.half_life_ms
        )
    }
}

impl GroupState {
    /// "hash", "flowlet" or "pinned": a config group's policy.
    pub fn policy_name(policy: &crate::control::config::Policy) -> String {
        use crate::control::config::Policy;
        match policy {
            Policy::Hash => "hash",
            Policy::Flowlet(_) => "flowlet",
            Policy::Pinned => "pinned",
        }
        .to_string()
    }

    /// A group's flowlet knobs, if it is a flowlet group.
    pub fn flowlet_knobs(policy: &crate::control::config::Policy) -> Option<FlowletKnobs> {
        let crate::control::config::Policy::Flowlet(f) = policy else { return None };
        Some(FlowletKnobs {
            gap_us: f.gap.as_micros() as u64,
            choice: f.choice,
            boundary: f.at_message_boundary,
            table_size: f.table_size,
            table: f.table,
        })
    }
}

/// A group's policy and knobs in a few words, for the `GROUP` lines of
/// `stats` and `stats --watch`: `hash qp`, `hash qp, flowlet gap 500us`,
/// `pinned, else hash qp`.
pub fn describe_policy(hash: &str, policy: &str, flowlet: Option<&FlowletKnobs>) -> String {
    match (policy, flowlet) {
        ("flowlet", Some(f)) => {
            let mut text = format!("hash {hash}, flowlet gap {}us", f.gap_us);
            if f.choice != FlowletChoice::Rehash {
                text.push_str(&format!(", {}", f.choice));
            }
            if f.boundary {
                text.push_str(", at message ends");
            }
            if f.table == rocev2_common::flowlet::FlowletTable::Keyless {
                text.push_str(&format!(", keyless {} slots", f.table_size));
            }
            text
        }
        ("pinned", _) => format!("pinned, else hash {hash}"),
        _ => format!("hash {hash}"),
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemberState {
    pub dev: String,
    pub next_hop: String,
    pub mac: String,
    /// In a `transport_aware` group: its transport health and demotions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::control::health::MemberHealth>,
}

/// File names under /run/rocev2 derived from the pin directory, so each
/// dataplane instance has its own.
fn run_file(pin_dir: &Path, ext: &str) -> PathBuf {
    let flat: String = pin_dir
        .to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    Path::new(RUN_DIR).join(format!("{flat}.{ext}"))
}

pub fn state_path(pin_dir: &Path) -> PathBuf {
    run_file(pin_dir, "json")
}

impl RunState {
    pub fn write(&self, pin_dir: &Path) -> Result<()> {
        let path = state_path(pin_dir);
        fs::create_dir_all(RUN_DIR).with_context(|| format!("cannot create {RUN_DIR}"))?;
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, serde_json::to_vec_pretty(self)?).with_context(|| format!("cannot write {}", tmp.display()))?;
        fs::rename(&tmp, &path).with_context(|| format!("cannot write {}", path.display()))
    }

    /// [`RunState::read`] of a run that must have telemetry on (what
    /// `top` and `trace` read): first whether anything runs there at all
    /// (if not, the error lists what does run), then whether it has
    /// telemetry; `reads_it` completes the second error's "runs without
    /// telemetry" (e.g. ", which trace rides on").
    pub fn read_with_telemetry(pin_dir: &Path, reads_it: &str) -> Result<Self> {
        let state = Self::read(pin_dir)?;
        if !crate::control::qp_telemetry::is_on(pin_dir) {
            bail!(
                "the `rocev2 run` using {} (pid {}, config {}) runs without telemetry{reads_it}: set telemetry_qps (e.g. 4096) in [dataplane] and restart `rocev2 run` (a new run takes over without interrupting traffic)",
                pin_dir.display(),
                state.pid,
                state.config.display()
            );
        }
        Ok(state)
    }

    /// The state of the instance using `pin_dir`. Without one, the error
    /// says so and lists the instances that do run, with their `--pin-dir`.
    pub fn read(pin_dir: &Path) -> Result<Self> {
        let path = state_path(pin_dir);
        let text = match fs::read(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                return Err(anyhow::Error::new(e)
                    .context(format!("cannot read {} (permission denied: run it as root)", path.display())))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("{}", not_running(pin_dir)),
            Err(e) => return Err(anyhow::Error::new(e).context(format!("cannot read {}", path.display()))),
        };
        let mut state: Self =
            serde_json::from_slice(&text).with_context(|| format!("{} is not valid rocev2 state", path.display()))?;
        if state.pin_dir.as_os_str().is_empty() {
            state.pin_dir = pin_dir.to_path_buf();
        }
        Ok(state)
    }

    pub fn remove(pin_dir: &Path) {
        let _ = fs::remove_file(state_path(pin_dir));
    }

    /// Marks the state file as current (its modification time): `run`
    /// does this every few seconds, so when it dies unannounced the file
    /// tells about when.
    pub fn touch(pin_dir: &Path) {
        let _ = nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &state_path(pin_dir),
            &nix::sys::time::TimeSpec::UTIME_NOW,
            &nix::sys::time::TimeSpec::UTIME_NOW,
            nix::sys::stat::UtimensatFlags::FollowSymlink,
        );
    }

    /// One line of a list of instances, starting with its newline:
    /// `"  --pin-dir DIR  (pid N{detail}, --netns NS)"`.
    pub fn listing_line(&self, detail: &str) -> String {
        let netns = self.netns.as_ref().map(|n| format!(", --netns {n}")).unwrap_or_default();
        format!("\n  --pin-dir {}  (pid {}{detail}{netns})", self.pin_dir.display(), self.pid)
    }

    /// Whether a live `rocev2 run` manages this dataplane, and if not,
    /// since when nobody has.
    pub fn manager(&self) -> Manager {
        if process_is_rocev2(self.pid) && self.handed_over_at.is_none() {
            return Manager::Running(self.pid);
        }
        let since = self.handed_over_at.or_else(|| {
            fs::metadata(state_path(&self.pin_dir))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs())
        });
        Manager::Nobody { pid: self.pid, since, handed_over: self.handed_over_at.is_some() }
    }
}

/// Who keeps a dataplane in step with the kernel and the config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Manager {
    /// A live `rocev2 run` with this pid.
    Running(u32),
    /// Nobody: the last run (pid) handed over or died; its programs still
    /// forward with the last config, but nothing follows link, neighbour
    /// or route changes. `since`: seconds since the epoch, when known.
    Nobody { pid: u32, since: Option<u64>, handed_over: bool },
}

impl Manager {
    /// None while a run manages it; else the warning to show, e.g. "no
    /// `rocev2 run` has managed the dataplane in /sys/fs/bpf/rocev2 since
    /// 10:52:09 (pid 56 handed over) ...".
    pub fn warning(&self, pin_dir: &Path) -> Option<String> {
        let Self::Nobody { pid, since, handed_over } = self else { return None };
        let since = since.map(|s| format!(" since {}", clock_time(s))).unwrap_or_default();
        let why = if *handed_over { "handed over and no new run took over" } else { "is gone: killed or crashed" };
        Some(format!(
            "no `rocev2 run` has managed the dataplane in {}{since} (pid {pid} {why}): its programs still forward with the last config, but nothing follows link, neighbour or route changes. Start `rocev2 run` to take it over without interruption, or `rocev2 detach --pin-dir {}` to remove it",
            pin_dir.display(),
            pin_dir.display()
        ))
    }
}

/// `HH:MM:SS` in local time (as the journal and `date` show it).
pub fn clock_time(epoch_secs: u64) -> String {
    let t = epoch_secs as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return format!("{epoch_secs} (epoch)");
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

/// Seconds since the epoch, now.
pub fn now_epoch() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Whether `pid` is a live (not zombie) process of this program.
pub fn process_is_rocev2(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    let Some((head, rest)) = stat.rsplit_once(')') else { return false };
    let comm = head.split_once('(').map_or("", |(_, c)| c);
    comm.starts_with("rocev2") && !rest.trim_start().starts_with('Z')
}

/// The `rocev2 run` instances that have a state file under /run/rocev2
/// (live or not), in pin directory order.
pub fn instances() -> Vec<RunState> {
    let Ok(dir) = fs::read_dir(RUN_DIR) else { return Vec::new() };
    let mut found: Vec<RunState> = dir
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        // Labs keep their records beside the instances.
        .filter(|p| !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("lab-")))
        .filter_map(|p| {
            let mut state = serde_json::from_slice::<RunState>(&fs::read(&p).ok()?).ok()?;
            if state.pin_dir.as_os_str().is_empty() {
                // Written before the pin directory was recorded: the file
                // name is the flattened path, exact for /sys/fs/bpf/NAME.
                let stem = p.file_stem()?.to_string_lossy().into_owned();
                state.pin_dir = Path::new(crate::sys::paths::BPFFS).join(stem.strip_prefix("sys_fs_bpf_")?);
            }
            Some(state)
        })
        .collect();
    found.sort_by(|a, b| a.pin_dir.cmp(&b.pin_dir));
    found
}

/// What to say when no state file exists for `pin_dir`: nothing runs
/// there; here is what does run.
fn not_running(pin_dir: &Path) -> String {
    let head = format!("no `rocev2 run` is using pin_dir {}", pin_dir.display());
    match running_list() {
        list if list.is_empty() => format!("{head}; none is running (start one with `rocev2 run --config FILE`)"),
        list => format!("{head}; running now (name one with --pin-dir DIR or --config FILE):{list}"),
    }
}

/// The live `rocev2 run` instances, a line each (`\n  --pin-dir DIR  (pid,
/// config, --netns)`); empty when none runs.
pub fn running_list() -> String {
    listing(instances().into_iter().filter(|s| matches!(s.manager(), Manager::Running(_))).collect())
}

/// `running` (in pin_dir order) as [`running_list`] prints it: past a
/// screenful, the runs started last (the one just started is likely the
/// one meant; a fabric lab alone runs eight), then how many more.
fn listing(mut running: Vec<RunState>) -> String {
    const LISTED: usize = 8;
    let hidden = if running.len() > LISTED + 1 { running.len() - LISTED } else { 0 };
    if hidden > 0 {
        running.sort_by_key(|s| std::cmp::Reverse(s.started_at));
        running.truncate(LISTED);
        running.sort_by(|a, b| a.pin_dir.cmp(&b.pin_dir));
    }
    let mut text = String::new();
    for s in &running {
        text.push_str(&s.listing_line(&format!(", config {}", s.config.display())));
    }
    if hidden > 0 {
        text.push_str(&format!("\n  and {hidden} started earlier (a state file each in {RUN_DIR})"));
    }
    text
}

/// Removes the state and lock files under /run/rocev2 that a killed
/// `rocev2 run` left for `pin_dir` (one that stops removes its own), unless
/// a `run` still holds the lock. Returns the files removed.
pub fn remove_leftovers(pin_dir: &Path) -> Result<Vec<PathBuf>> {
    let (state, lock_path) = (state_path(pin_dir), run_file(pin_dir, "lock"));
    if !state.exists() && !lock_path.exists() {
        return Ok(Vec::new());
    }
    let had_lock = lock_path.exists();
    let Ok(lock) = RunLock::acquire(pin_dir) else {
        return Ok(Vec::new()); // a live run owns them
    };
    let mut removed = Vec::new();
    match fs::remove_file(&state) {
        Ok(()) => removed.push(state),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(anyhow::Error::new(e).context(format!("cannot remove {}", state.display()))),
    }
    drop(lock); // removes the lock file
    if had_lock {
        removed.push(lock_path);
    }
    Ok(removed)
}

/// An exclusive lock on a pin directory, held for the life of `rocev2 run`.
pub struct RunLock {
    /// Holds the lock until dropped.
    _file: nix::fcntl::Flock<fs::File>,
    path: PathBuf,
}

impl RunLock {
    pub fn acquire(pin_dir: &Path) -> Result<Self> {
        fs::create_dir_all(RUN_DIR).with_context(|| format!("cannot create {RUN_DIR}"))?;
        let path = run_file(pin_dir, "lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open lock file {}", path.display()))?;
        let mut file = match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(locked) => locked,
            Err(_) => {
                let holder = fs::read_to_string(&path).unwrap_or_default();
                bail!(
                    "another `rocev2 run` (pid {}) already uses pin_dir {}; stop it or set a different [dataplane] pin_dir",
                    holder.trim(),
                    pin_dir.display()
                );
            }
        };
        file.set_len(0)?;
        write!(file, "{}", std::process::id())?;
        Ok(Self { _file: file, path })
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_of_a_killed_run_go_but_not_those_of_a_live_one() {
        if fs::create_dir_all(RUN_DIR).is_err() && std::env::var_os("CI").is_none() {
            return; // not root: /run/rocev2 is out of reach
        }
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/rocev2-leftovers-{}", std::process::id()));
        let (state, lock) = (state_path(&pin_dir), run_file(&pin_dir, "lock"));
        // Killed: both files stay behind, nobody holds the lock.
        fs::write(&state, "{}").unwrap();
        fs::write(&lock, "4242").unwrap();
        assert_eq!(remove_leftovers(&pin_dir).unwrap(), vec![state.clone(), lock.clone()]);
        assert!(!state.exists() && !lock.exists());
        // Alive: its lock is held, nothing is removed.
        let held = RunLock::acquire(&pin_dir).unwrap();
        fs::write(&state, "{}").unwrap();
        assert_eq!(remove_leftovers(&pin_dir).unwrap(), Vec::<PathBuf>::new());
        assert!(state.exists() && lock.exists());
        drop(held);
        fs::remove_file(&state).unwrap();
        assert_eq!(remove_leftovers(&pin_dir).unwrap(), Vec::<PathBuf>::new());
    }

    #[test]
    fn a_long_list_of_runs_keeps_the_ones_started_last() {
        let run = |i: u32, started_at: u64| RunState {
            pid: 100 + i,
            pin_dir: PathBuf::from(format!("/sys/fs/bpf/rocev2-{i:02}")),
            started_at,
            ..Default::default()
        };
        // Nine fit: no "and 1 more".
        let nine = listing((0..9).map(|i| run(i, 1)).collect());
        assert_eq!(nine.lines().count(), 1 + 9, "{nine}");
        // Ten: the eight started last (2..=9), in pin_dir order, then how many more.
        let ten = listing((0..10).map(|i| run(i, 1000 + u64::from(i))).collect());
        let shown: Vec<&str> = ten.lines().skip(1).collect();
        assert!(shown[0].starts_with("  --pin-dir /sys/fs/bpf/rocev2-02  (pid 102"), "{ten}");
        assert!(shown[7].starts_with("  --pin-dir /sys/fs/bpf/rocev2-09  (pid 109"), "{ten}");
        assert_eq!(shown[8], "  and 2 started earlier (a state file each in /run/rocev2)");
    }

    #[test]
    fn learned_line_says_when_nothing_was_applied_yet() {
        let mut learned =
            LearnedStats { table: 254, routes: 3, hosts: 2, groups: 1, messages: 6, ..Default::default() };
        learned.to_kernel.insert("connected".into(), 2);
        assert_eq!(
            learned.describe(),
            "kernel table 254: 3 prefixes forwarded (2 host entries), 1 learned groups, to the kernel: connected 2; 6 messages, 0 resyncs, no changes applied since the start"
        );
        learned.apply_samples = 4;
        learned.apply_us_p50 = 412;
        learned.apply_us_p99 = 1188;
        assert!(learned.describe().ends_with("; 6 messages, 0 resyncs, apply p50 412 us p99 1188 us"));
    }

    #[test]
    fn reload_outcomes_read_both_forms() {
        let read = |json: &str| serde_json::from_str::<ReloadOutcome>(json).unwrap();
        let refused = ReloadOutcome::Refused { reason: RefusalReason::NeedsRestart, message: "x changed".into() };
        for outcome in [ReloadOutcome::None, ReloadOutcome::Applied, refused.clone()] {
            assert_eq!(read(&serde_json::to_string(&outcome).unwrap()), outcome);
        }
        assert_eq!(
            serde_json::to_string(&refused).unwrap(),
            r#"{"outcome":"refused","reason":"needs-restart","message":"x changed"}"#
        );
        // What a run from before wrote.
        assert_eq!(read(r#""ok""#), ReloadOutcome::Applied);
        assert_eq!(read(r#""""#), ReloadOutcome::None);
        assert_eq!(
            read(r#""lab.toml:3:1: group[0].name: ...""#),
            ReloadOutcome::Refused {
                reason: RefusalReason::Unknown,
                message: "lab.toml:3:1: group[0].name: ...".into()
            }
        );
    }

    #[test]
    fn a_state_file_from_before_the_policy_was_recorded_still_reads() {
        let old = r#"{"pid": 7, "config": "/etc/leaf.toml", "netns": null, "ports": [],
            "groups": [{"name": "spines", "index": 0, "hash": "qp", "members": []}]}"#;
        let state: RunState = serde_json::from_str(old).unwrap();
        let g = &state.groups[0];
        assert_eq!((g.policy.as_str(), g.flowlet.as_ref()), ("", None));
        assert_eq!(describe_policy(&g.hash, &g.policy, g.flowlet.as_ref()), "hash qp");
    }

    #[test]
    fn the_policy_reads_in_a_few_words() {
        let knobs = FlowletKnobs {
            gap_us: 500,
            choice: FlowletChoice::Rehash,
            boundary: false,
            table_size: 65536,
            table: Default::default(),
        };
        assert_eq!(describe_policy("qp", "flowlet", Some(&knobs)), "hash qp, flowlet gap 500us");
        let keyless =
            FlowletKnobs { table_size: 512, table: rocev2_common::flowlet::FlowletTable::Keyless, ..knobs.clone() };
        assert_eq!(describe_policy("qp", "flowlet", Some(&keyless)), "hash qp, flowlet gap 500us, keyless 512 slots");
        // A state file from before `flowlet_table` reads as keyed.
        let old: FlowletKnobs =
            serde_json::from_str(r#"{"gap_us":500,"choice":"rehash","boundary":false,"table_size":65536}"#).unwrap();
        assert_eq!(old.table, rocev2_common::flowlet::FlowletTable::Keyed);
        let knobs = FlowletKnobs { choice: FlowletChoice::LeastLoaded, boundary: true, ..knobs };
        assert_eq!(
            describe_policy("five-tuple", "flowlet", Some(&knobs)),
            "hash five-tuple, flowlet gap 500us, least-loaded, at message ends"
        );
        assert_eq!(describe_policy("qp", "pinned", None), "pinned, else hash qp");
        assert_eq!(describe_policy("five-tuple", "hash", None), "hash five-tuple");
    }
}
