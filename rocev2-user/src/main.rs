//! `rocev2`: the command-line front end. Each subcommand is a thin wrapper
//! over the library.

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use rocev2_user::{
    control::config::{Config, XdpMode},
    control::dataplane::Maps,
    control::run::{self, RunOptions},
    control::state::RunState,
    control::stats::Snapshot,
    control::watch,
    sys::netns,
    sys::paths::DEFAULT_CONFIG,
    sys::privileges::{self, Need},
    testbed::lab::{self, LabCommand},
    tools::entropy::{self, EntropyArgs},
    tools::explain::{self, ExplainArgs},
    tools::gen::{self, GenArgs},
    tools::sink::{self, SinkArgs},
};

/// The heading of the options every subcommand takes, listed after its own.
const GLOBAL: &str = "Global options";

#[derive(Parser)]
#[command(
    name = "rocev2",
    version = rocev2_version::VERSION,
    about = "RoCEv2-aware XDP dataplane: E-ECMP forwarding with QP hashing",
    after_long_help = FILES_HELP
)]
struct Cli {
    /// Run inside this network namespace (a name from `ip netns list`).
    /// Unlike `ip netns exec`, this keeps the host's /sys/fs/bpf, where
    /// `run` pins the maps the other subcommands read.
    // Not a file: completions offer none (`ip netns list` names them).
    #[arg(long, global = true, value_name = "NAME", help_heading = GLOBAL, value_hint = clap::ValueHint::Other)]
    netns: Option<String>,
    /// Level of the log lines (on stderr; `run` logs its events, the
    /// others little): error, warn, info, debug or trace. Default:
    /// RUST_LOG (a tracing filter such as `warn` or `rocev2_user=debug`),
    /// else info.
    #[arg(long, global = true, value_name = "LEVEL", help_heading = GLOBAL)]
    log_level: Option<tracing::Level>,
    /// Log line format: text (timestamps only on a terminal; journald adds
    /// its own) or json (one object per line, for log shippers).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, help_heading = GLOBAL)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(
    rustdoc::broken_intra_doc_links,
    reason = "these comments are clap's --help text, where [dataplane] names the config's table, not an item"
)]
enum Command {
    /// Load and attach the dataplane, fill its maps from FILE, run until SIGINT/SIGTERM.
    Run {
        /// The config file (TOML; every key: `man 5 rocev2.toml`).
        #[arg(long, short, value_name = "FILE", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Override [dataplane] xdp_mode.
        #[arg(long, value_enum)]
        xdp_mode: Option<XdpMode>,
        /// Serve Prometheus metrics at http://ADDR/metrics. A bare port
        /// (9464) binds to loopback; give an address (0.0.0.0:9464) to
        /// expose the counters beyond this box.
        #[arg(long, value_name = "ADDR", value_parser = parse_metrics_addr)]
        metrics_addr: Option<std::net::SocketAddr>,
    },
    /// Validate a config file without loading anything: its syntax and
    /// values, and that every interface it names exists here (in the
    /// namespace given by --netns).
    Check {
        /// The config file to check.
        #[arg(long, short, value_name = "FILE", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Check only the file, not the interfaces: for a config meant for another box.
        #[arg(long)]
        offline: bool,
    },
    /// Print the counters of a running `rocev2 run`.
    Stats {
        /// Config of the running instance (to find its pin_dir). Without
        /// --config or --pin-dir: /etc/rocev2/rocev2.toml if it exists,
        /// else the default pin directory /sys/fs/bpf/rocev2.
        #[arg(long, short, value_name = "FILE", conflicts_with = "pin_dir")]
        config: Option<PathBuf>,
        /// Pin directory of the running instance.
        #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
        pin_dir: Option<PathBuf>,
        /// Machine-readable output.
        #[arg(long, conflicts_with = "watch")]
        json: bool,
        /// Refresh every --interval seconds with per-port and per-member rates.
        #[arg(long)]
        watch: bool,
        /// Seconds between refreshes with --watch.
        #[arg(long, default_value_t = 1.0, requires = "watch")]
        interval: f64,
        /// Only the groups whose name is or contains NAME (repeat for
        /// more), e.g. `--group spines` or, for learned groups, `--group s2l1`.
        #[arg(long, value_name = "NAME", conflicts_with = "watch")]
        group: Vec<String>,
    },
    /// The busiest and unhealthiest QPs of a running `rocev2 run`, live
    /// (needs `telemetry_qps` in [dataplane]).
    Top(rocev2_user::control::top::TopArgs),
    /// Print each matching packet's forwarding decision as it happens
    /// (needs `telemetry_qps` in [dataplane]).
    Trace(rocev2_user::control::trace::TraceArgs),
    /// Make a running `rocev2 run` re-read its config file and apply it
    /// without interrupting traffic (the same as `kill -HUP`).
    Reload {
        /// Config of the running instance (to find it; it re-reads its own
        /// file). Without --config or --pin-dir: /etc/rocev2/rocev2.toml if
        /// it exists, else the default pin directory /sys/fs/bpf/rocev2.
        #[arg(long, short, value_name = "FILE", conflicts_with = "pin_dir")]
        config: Option<PathBuf>,
        /// Pin directory of the running instance.
        #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
        pin_dir: Option<PathBuf>,
    },
    /// Move a running `rocev2 run` onto this binary without losing a packet:
    /// it hands over (SIGUSR1: exits, the dataplane keeps forwarding), then
    /// its systemd unit is started again, or, outside systemd, this command
    /// becomes the new `rocev2 run --config <the same file>`, which takes
    /// over the pinned links.
    Upgrade {
        /// Config of the running instance (to find it). Without --config or
        /// --pin-dir: /etc/rocev2/rocev2.toml if it exists, else the default
        /// pin directory /sys/fs/bpf/rocev2.
        #[arg(long, short, value_name = "FILE", conflicts_with = "pin_dir")]
        config: Option<PathBuf>,
        /// Pin directory of the running instance.
        #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
        pin_dir: Option<PathBuf>,
        /// systemd unit to start after the handover (default: the rocev2*.service
        /// the running instance belongs to, if any).
        #[arg(long, value_name = "UNIT")]
        unit: Option<String>,
    },
    /// Remove what a `rocev2 run` that is gone left attached (after `kill
    /// -9`, a crash, or a handover no new run took): detach its XDP
    /// programs from the ports and remove its pinned maps and state, like
    /// `xdp-loader unload`. Refuses while a live run manages the dataplane
    /// (stop that one instead).
    Detach {
        /// Config of the instance (to find its pin_dir). Without --config or
        /// --pin-dir: /etc/rocev2/rocev2.toml if it exists, else the
        /// default pin directory /sys/fs/bpf/rocev2.
        #[arg(long, short, value_name = "FILE", conflicts_with = "pin_dir")]
        config: Option<PathBuf>,
        /// Pin directory of the instance.
        #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
        pin_dir: Option<PathBuf>,
    },
    /// Labs of network namespaces to try rocev2 in: one rack switch with
    /// its spines, a fabric of racks and spines (`--racks`; optional
    /// aggregation tier; static routes or FRR/BGP) with rocev2 on every
    /// switch, or a host bridge (`--host-bridge`); traffic, collectives,
    /// link failures and churn on them.
    Lab {
        #[command(subcommand)]
        command: LabCommand,
    },
    /// Send RoCEv2 traffic (WRITE messages, ACKs, CNPs, CTS) out of an interface.
    Gen(GenArgs),
    /// Count received RoCEv2 packets per QP: PSN order, ICRC, ECN marks.
    Sink(SinkArgs),
    /// Lose chosen RoCEv2 packets (QP, PSN) on an interface, for lab
    /// experiments with `gen --rc`, `sink --rc` and `rocev2 top`.
    Fault(rocev2_user::testbed::fault::FaultArgs),
    /// Simulate how hash modes spread RDMA flows over uplinks (offline, teaching).
    Entropy(EntropyArgs),
    /// Show which route, group and member a packet takes, and why.
    Explain(ExplainArgs),
    /// Print a shell completion script (e.g. `rocev2 completions bash > /etc/bash_completion.d/rocev2`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), generated from these same definitions;
    /// with --out-dir, write rocev2.1 and one page per subcommand there,
    /// and rocev2.toml.5, the config file's keys (from the reference the
    /// book's page is generated from too).
    #[command(hide = true)]
    Man {
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// Measure per-packet cost, forwarding rate and control-plane times; write BENCHMARKS.md (`cargo xtask bench`).
    #[command(hide = true)]
    Bench(rocev2_user::testbed::bench::BenchArgs),
    /// Build a small veth lab, run the dataplane with five-tuple and then QP
    /// hashing, send RoCEv2 traffic through it and print the per-uplink result.
    Demo {
        /// Queue pairs between the two hosts (all share one UDP source port).
        #[arg(long, default_value_t = 64)]
        qps: u32,
        /// Packets sent per QP and per address family.
        #[arg(long, default_value_t = 20)]
        packets_per_qp: u32,
        /// Uplinks in the ECMP group.
        #[arg(long, default_value_t = 4)]
        uplinks: u32,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Events (tracing) go to stderr, one line each; the commands' own output
/// (tables, `rocev2: ready`, final counters) stays on stdout. A text line
/// is the level and the message, which already says every fact in words;
/// JSON carries the facts as fields too, for log shippers.
fn init_logging(level: Option<tracing::Level>, format: LogFormat) {
    use std::io::IsTerminal as _;
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(level) => EnvFilter::new(level.as_str()),
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.with_target(false).json().flatten_event(true).try_init(),
        // Timestamps only on a terminal: the journal adds its own.
        LogFormat::Text => builder.event_format(TextLine { timestamps: std::io::stderr().is_terminal() }).try_init(),
    };
}

/// ` WARN member s1l1 via 10.100.17.2 left group spines: no carrier`: the
/// level and the message, without repeating the fields after it.
struct TextLine {
    timestamps: bool,
}

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for TextLine
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use tracing_subscriber::fmt::time::FormatTime as _;
        if self.timestamps {
            tracing_subscriber::fmt::time::SystemTime.format_time(&mut writer)?;
            write!(writer, " ")?;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        writeln!(writer, "{:>5} {}", event.metadata().level(), message.0)
    }
}

/// Collects an event's `message` field.
struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

/// Closing part of `--help` and of the man page.
/// rocev2(1): clap's sections, then FILES and SIGNALS as roff (the
/// `--help` text of [`FILES_HELP`] is laid out for a terminal, which roff
/// would re-wrap).
fn render_main_man_page(out: &mut dyn std::io::Write) -> std::io::Result<()> {
    let man = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command());
    man.render_title(out)?;
    man.render_name_section(out)?;
    man.render_synopsis_section(out)?;
    man.render_description_section(out)?;
    man.render_options_section(out)?;
    man.render_subcommands_section(out)?;
    out.write_all(FILES_AND_SIGNALS_ROFF.as_bytes())?;
    man.render_version_section(out)
}

const FILES_AND_SIGNALS_ROFF: &str = r#".SH FILES
.TP
\fI/etc/rocev2/rocev2.toml\fR
The config \fBrun\fR, \fBcheck\fR and \fBexplain\fR use without \fB\-\-config\fR, and so do the commands that find a running instance without \fB\-\-config\fR or \fB\-\-pin\-dir\fR (\fBstats\fR, \fBtop\fR, \fBtrace\fR, \fBreload\fR, \fBupgrade\fR, \fBdetach\fR), which fall back to the pin directory /sys/fs/bpf/rocev2 when that file does not exist. Every key it takes: \fBrocev2.toml\fR(5).
.TP
\fI/sys/fs/bpf/rocev2\fR
The default pin_dir: the maps and the XDP links of a running \fBrocev2 run\fR.
.TP
\fI/run/rocev2\fR
The state file and run lock of each running instance.
.SH SIGNALS
Signals to \fBrocev2 run\fR:
.TP
\fBSIGINT\fR, \fBSIGTERM\fR
Stop: detach the programs and print the final counters.
.TP
\fBSIGHUP\fR
Read the config again and apply it (\fBrocev2 reload\fR).
.TP
\fBSIGUSR1\fR
Exit and leave the dataplane forwarding for the next run (\fBrocev2 upgrade\fR).
.PP
What a run killed with SIGKILL left attached: \fBrocev2 detach\fR removes it (or a new \fBrocev2 run\fR takes it over).
"#;

const FILES_HELP: &str = "Files:
  /etc/rocev2/rocev2.toml  the config `run`, `check` and `explain` use without --config, and so
                           do the commands that find a running instance without --config or
                           --pin-dir (`stats`, `top`, `trace`, `reload`, `upgrade`, `detach`),
                           which fall back to the pin directory /sys/fs/bpf/rocev2 when that file
                           does not exist; every key it takes: `man rocev2.toml`
  /sys/fs/bpf/rocev2       default pin_dir: the maps and the XDP links of a running `rocev2 run`
  /run/rocev2              state file and run lock of each running instance

Signals to `rocev2 run`: SIGINT/SIGTERM stop (detach, print the final counters); SIGHUP reloads the
config (`rocev2 reload`); SIGUSR1 exits leaving the dataplane forwarding for the next run (`rocev2 upgrade`).
What a run killed with SIGKILL left attached: `rocev2 detach` removes it (or a new `rocev2 run` takes it over).

Each subcommand has its own help: `rocev2 help run`.";

/// The pin directory of the running instance `stats` and `reload` talk to:
/// the given config's, the given directory, the default config's if that
/// file exists, else the default pin directory.
fn running_pin_dir(config: Option<PathBuf>, pin_dir: Option<PathBuf>) -> Result<PathBuf> {
    running_pin_dir_with(config, pin_dir, std::path::Path::new(DEFAULT_CONFIG))
}

fn running_pin_dir_with(
    config: Option<PathBuf>,
    pin_dir: Option<PathBuf>,
    default_config: &std::path::Path,
) -> Result<PathBuf> {
    Ok(match (config, pin_dir) {
        (Some(path), _) => Config::load(&path)?.dataplane.pin_dir,
        (None, Some(dir)) => dir,
        (None, None) if default_config.exists() => Config::load(default_config)?.dataplane.pin_dir,
        (None, None) => PathBuf::from(rocev2_common::maps::PIN_DIR),
    })
}

/// `9464` means 127.0.0.1:9464; anything else must be a socket address.
fn parse_metrics_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse().map_err(|_| format!("{text:?} is not a port or an address:port such as 127.0.0.1:9464"))
}

fn main() -> ExitCode {
    // Like other Unix tools, stop quietly when the reader of our output goes
    // away (`rocev2 stats --json | head`) instead of panicking on EPIPE.
    // SAFETY: called before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    init_logging(cli.log_level, cli.log_format);
    match real_main(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rocev2: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> Result<()> {
    // Enter the namespace before the runtime starts threads, so every
    // thread (and every netlink socket) lives in it.
    if let Some(name) = &cli.netns {
        privileges::require("--netns", Need::EnterNamespace)?;
        netns::enter_process(name)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match cli.command {
        Command::Run { config, xdp_mode, metrics_addr } => {
            let config = Config::load(&config)?;
            let options = RunOptions { xdp_mode, metrics_addr };
            match runtime.block_on(run::run(config, options, cli.netns.clone()))? {
                run::Ending::Stopped(snapshot) => println!("rocev2: stopped; final counters:\n{}", snapshot.render()),
                run::Ending::HandedOver(snapshot) => println!(
                    "rocev2: handed over: the programs stay attached and the maps pinned; the next `rocev2 run` takes over without interruption. Counters so far:\n{}",
                    snapshot.render()
                ),
            }
        }
        Command::Check { config, offline } => {
            let config = Config::load(&config)?;
            for warning in &config.warnings {
                eprintln!("rocev2: warning: {warning}");
            }
            let interfaces = if offline {
                "interfaces not looked up (--offline)".to_string()
            } else {
                runtime.block_on(async {
                    let netlink = rocev2_user::sys::netlink::Netlink::new()?;
                    run::resolve_links(&netlink, &config).await
                })?;
                format!("interfaces found in {}", netns::describe_current())
            };
            // Learned routes: say which table, and what shapes them.
            let learned = match &config.routing.kernel_table {
                None => String::new(),
                Some(table) => format!(
                    " + the routes of kernel table {}{}",
                    match table {
                        rocev2_user::control::config::KernelTable::Id(id) => id.to_string(),
                        rocev2_user::control::config::KernelTable::Vrf(name) => format!("of VRF {name}"),
                    },
                    match (config.route_policies.len(), config.learned_pins.len()) {
                        (0, 0) => String::new(),
                        (p, n) => format!(" ({p} route policies, {n} learned-route pins)"),
                    }
                ),
            };
            println!(
                "{}: OK ({} ports, {} groups, {} members, {} routes{learned}; {interfaces})",
                config.path.display(),
                config.ports.len(),
                config.groups.len(),
                config.groups.iter().map(|g| g.members.len()).sum::<usize>(),
                config.routes.len()
            );
            // As `nginx -t` previews a reload: would the running instance take it?
            if let Ok(running) = RunState::read(&config.dataplane.pin_dir) {
                let loaded = rocev2_common::features::Features(running.features);
                let missing = config.features().without(loaded);
                if running.features != 0 && missing != rocev2_common::features::Features::NONE {
                    let names = missing.names().collect::<Vec<_>>().join(", ");
                    println!(
                        "note: the running `rocev2 run` (pid {}) was loaded without {names}: `rocev2 reload` will refuse this file; restart `rocev2 run` to apply it (a new run takes over without dropping traffic)",
                        running.pid
                    );
                }
            }
        }
        Command::Stats { config, pin_dir, json, watch, interval, group } => {
            let pin_dir = running_pin_dir(config, pin_dir)?;
            privileges::require("stats", Need::PinnedMaps(&pin_dir))?;
            if watch {
                if !(interval > 0.0 && interval.is_finite()) {
                    anyhow::bail!("--interval must be a positive number of seconds, not {interval}");
                }
                return watch::watch(&pin_dir, std::time::Duration::from_secs_f64(interval), None);
            }
            let state = RunState::read(&pin_dir)?;
            let maps = Maps::open_pinned(&pin_dir)?;
            let mut snapshot = Snapshot::collect(&maps, &state)?;
            snapshot.add_transport(&pin_dir, &state)?;
            snapshot.keep_groups(&group)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&snapshot).context("cannot encode JSON")?);
                if let Some(warning) = snapshot.refusal_warning() {
                    eprintln!("rocev2: {warning}");
                }
            } else {
                print!("{}", snapshot.render());
            }
        }
        Command::Trace(args) => {
            let pin_dir = running_pin_dir(args.config.clone(), args.pin_dir.clone())?;
            privileges::require("trace", Need::PinnedMaps(&pin_dir))?;
            rocev2_user::control::trace::run(&pin_dir, &args)?;
        }
        Command::Top(args) => {
            let pin_dir = running_pin_dir(args.config.clone(), args.pin_dir.clone())?;
            privileges::require("top", Need::PinnedMaps(&pin_dir))?;
            rocev2_user::control::top::run(&pin_dir, &args)?;
        }
        Command::Demo { qps, packets_per_qp, uplinks } => {
            privileges::require("demo", Need::Namespaces)?;
            privileges::require("demo", Need::LoadXdp)?;
            rocev2_user::testbed::ecmp_lab::demo(qps, packets_per_qp, uplinks)?;
        }
        Command::Detach { config, pin_dir } => {
            let pin_dir = running_pin_dir(config, pin_dir)?;
            privileges::require("detach", Need::PinnedMaps(&pin_dir))?;
            let detached = rocev2_user::control::detach::detach(&pin_dir)?;
            if let Some(counters) = &detached.counters {
                println!("rocev2: final counters:\n{}", counters.render());
            }
            let ports = match detached.ports.as_slice() {
                [] => "no port had it attached".to_string(),
                ports => format!("detached from {}", ports.join(", ")),
            };
            println!("rocev2: {ports}; removed {} and its state", pin_dir.display());
        }
        Command::Reload { config, pin_dir } => {
            let pin_dir = running_pin_dir(config, pin_dir)?;
            privileges::require("reload", Need::PinnedMaps(&pin_dir))?;
            let outcome = run::request_reload(&pin_dir, std::time::Duration::from_secs(30))?;
            println!("rocev2: reloaded {}", outcome.display());
        }
        Command::Upgrade { config, pin_dir, unit } => {
            let pin_dir = running_pin_dir(config, pin_dir)?;
            privileges::require("upgrade", Need::PinnedMaps(&pin_dir))?;
            rocev2_user::control::upgrade::upgrade(&pin_dir, unit, std::time::Duration::from_secs(30))?;
        }
        Command::Lab { command } => {
            let need = match command {
                LabCommand::Status(_) | LabCommand::Stats(_) => Need::InspectNamespaces,
                _ => Need::Namespaces,
            };
            privileges::require(command.as_typed(), need)?;
            lab::run(&command)?
        }
        Command::Gen(args) => {
            privileges::require("gen", Need::RawSockets)?;
            if args.mode == gen::GenMode::LiveFrames {
                privileges::require("gen --mode live-frames", Need::LoadXdp)?;
            }
            if args.rc {
                let report = rocev2_user::tools::rc::request(&args)?;
                if args.json {
                    println!("{}", serde_json::to_string_pretty(&report)?);
                } else {
                    println!("{}", report.render());
                }
                if !report.complete {
                    anyhow::bail!("not every PSN was acknowledged within the time limit");
                }
            } else {
                gen::run(&args)?;
            }
        }
        Command::Sink(args) => {
            privileges::require("sink", Need::RawSockets)?;
            sink::run(&args)?;
        }
        Command::Fault(args) => {
            privileges::require("fault", Need::LoadXdp)?;
            rocev2_user::testbed::fault::run(&args)?;
        }
        Command::Entropy(args) => entropy::run(&args)?,
        Command::Explain(args) => explain::run(&args)?,
        Command::Bench(args) => rocev2_user::testbed::bench::run(&args)?,
        Command::Completions { shell } => clap_complete::generate(
            shell,
            &mut <Cli as clap::CommandFactory>::command(),
            "rocev2",
            &mut std::io::stdout(),
        ),
        Command::Man { out_dir: None } => {
            render_main_man_page(&mut std::io::stdout()).context("cannot write the man page")?
        }
        Command::Man { out_dir: Some(dir) } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(<Cli as clap::CommandFactory>::command(), &dir)
                .with_context(|| format!("cannot write man pages to {}", dir.display()))?;
            // rocev2.1 again, with real FILES and SIGNALS sections.
            let main = dir.join("rocev2.1");
            let mut file = std::fs::File::create(&main).with_context(|| format!("cannot write {}", main.display()))?;
            render_main_man_page(&mut file).with_context(|| format!("cannot write {}", main.display()))?;
            let page = dir.join("rocev2.toml.5");
            let version = env!("CARGO_PKG_VERSION");
            std::fs::write(&page, rocev2_user::control::config::reference::man_page(version))
                .with_context(|| format!("cannot write {}", page.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_options_come_after_the_subcommands_own() {
        let mut cli = <Cli as clap::CommandFactory>::command();
        cli.build();
        let help = cli.find_subcommand_mut("run").unwrap().render_help().to_string();
        let (own, global) = help.split_once("Global options:").expect(&help);
        assert!(own.contains("--config") && own.contains("--metrics-addr") && !own.contains("--netns"), "{help}");
        assert!(global.contains("--netns") && global.contains("--log-level") && global.contains("--log-format"));
    }

    #[test]
    fn the_man_page_has_files_and_signals_sections_not_an_extra_one() {
        let mut page = Vec::new();
        render_main_man_page(&mut page).unwrap();
        let page = String::from_utf8(page).unwrap();
        for section in [".SH NAME", ".SH SYNOPSIS", ".SH OPTIONS", ".SH SUBCOMMANDS", ".SH FILES", ".SH SIGNALS"] {
            assert!(page.contains(section), "{section} missing:\n{page}");
        }
        assert!(!page.contains("EXTRA"), "{page}");
    }

    #[test]
    fn run_check_and_explain_default_to_the_etc_config() {
        for sub in ["run", "check", "explain"] {
            let cli = Cli::try_parse_from(
                &["rocev2", sub, "--src", "10.0.0.1", "--dst", "10.1.0.1"][..if sub == "explain" { 6 } else { 2 }],
            )
            .unwrap();
            let config = match cli.command {
                Command::Run { config, .. } | Command::Check { config, .. } => config,
                Command::Explain(args) => args.config,
                _ => unreachable!(),
            };
            assert_eq!(config, PathBuf::from("/etc/rocev2/rocev2.toml"), "{sub}");
        }
    }

    #[test]
    fn stats_and_reload_use_the_default_config_if_it_exists_else_the_default_pin_dir() {
        let dir = std::env::temp_dir().join(format!("rocev2-default-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let default_config = dir.join("rocev2.toml");
        // Absent: the default pin dir, as before there was a default config.
        assert_eq!(running_pin_dir_with(None, None, &default_config).unwrap(), PathBuf::from("/sys/fs/bpf/rocev2"));
        // Present: its pin_dir.
        std::fs::write(&default_config, "[dataplane]\npin_dir = \"/sys/fs/bpf/rocev2-x\"\n[[port]]\nname = \"eth1\"\n")
            .unwrap();
        assert_eq!(running_pin_dir_with(None, None, &default_config).unwrap(), PathBuf::from("/sys/fs/bpf/rocev2-x"));
        // Explicit choices win.
        let given = PathBuf::from("/sys/fs/bpf/other");
        assert_eq!(running_pin_dir_with(None, Some(given.clone()), &default_config).unwrap(), given);
        // A broken default config is an error, not a silent fallback.
        std::fs::write(&default_config, "[dataplane]\npin_dir = 3\n").unwrap();
        assert!(running_pin_dir_with(None, None, &default_config).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
