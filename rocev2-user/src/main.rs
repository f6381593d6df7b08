//! `rocev2`: the command-line front end. Each subcommand is a thin wrapper
//! over the library.

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand, ValueEnum};
use rocev2_user::{
    config::{Config, XdpMode},
    dataplane::Maps,
    entropy::{self, EntropyArgs},
    explain::{self, ExplainArgs},
    gen::{self, GenArgs},
    labcmd::{self, LabCommand},
    netns,
    privileges::{self, Need},
    run::{self, RunOptions},
    sink::{self, SinkArgs},
    state::RunState,
    stats::Snapshot,
    watch,
};

#[derive(Parser)]
#[command(name = "rocev2", version, about = "RoCEv2-aware XDP dataplane: E-ECMP forwarding with QP hashing")]
struct Cli {
    /// Run inside this network namespace (a name from `ip netns list`).
    /// Unlike `ip netns exec`, this keeps the host's /sys/fs/bpf, so pinned
    /// maps stay visible to `rocev2 stats`.
    #[arg(long, global = true, value_name = "NAME")]
    netns: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Load and attach the dataplane, fill its maps from FILE, run until SIGINT/SIGTERM.
    Run {
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        /// Override [dataplane] xdp_mode.
        #[arg(long, value_enum)]
        xdp_mode: Option<CliXdpMode>,
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
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
        /// Check only the file, not the interfaces: for a config meant for another box.
        #[arg(long)]
        offline: bool,
    },
    /// Print the counters of a running `rocev2 run`.
    Stats {
        /// Config of the running instance (to find its pin_dir).
        #[arg(long, short, value_name = "FILE", conflicts_with = "pin_dir")]
        config: Option<PathBuf>,
        /// Pin directory of the running instance.
        #[arg(long, value_name = "DIR")]
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
    },
    /// Make a running `rocev2 run` re-read its config file and apply it
    /// without interrupting traffic (the same as `kill -HUP`).
    Reload {
        /// Config of the running instance (to find it; it re-reads its own file).
        #[arg(long, short, value_name = "FILE", conflicts_with = "pin_dir")]
        config: Option<PathBuf>,
        /// Pin directory of the running instance.
        #[arg(long, value_name = "DIR")]
        pin_dir: Option<PathBuf>,
    },
    /// Build, inspect or remove a leaf-spine lab of network namespaces.
    Lab {
        #[command(subcommand)]
        command: LabCommand,
    },
    /// Send RoCEv2 traffic (WRITE messages, ACKs, CNPs, CTS) out of an interface.
    Gen(GenArgs),
    /// Count received RoCEv2 packets per QP: PSN order, ICRC, ECN marks.
    Sink(SinkArgs),
    /// Simulate how hash modes spread RDMA flows over uplinks (offline, teaching).
    Entropy(EntropyArgs),
    /// Show which route, group and member a packet takes, and why.
    Explain(ExplainArgs),
    /// Measure per-packet cost, forwarding rate and control-plane times; write BENCHMARKS.md (`cargo xtask bench`).
    #[command(hide = true)]
    Bench(rocev2_user::bench::BenchArgs),
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
enum CliXdpMode {
    Native,
    Skb,
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
            let options = RunOptions {
                xdp_mode: xdp_mode.map(|m| match m {
                    CliXdpMode::Native => XdpMode::Native,
                    CliXdpMode::Skb => XdpMode::Skb,
                }),
                metrics_addr,
            };
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
            let interfaces = if offline {
                "interfaces not looked up (--offline)".to_string()
            } else {
                runtime.block_on(async {
                    let netlink = rocev2_user::netlink::Netlink::new()?;
                    run::resolve_links(&netlink, &config).await
                })?;
                format!("interfaces found in {}", netns::describe_current())
            };
            println!(
                "{}: OK ({} ports, {} groups, {} members, {} routes; {interfaces})",
                config.path.display(),
                config.ports.len(),
                config.groups.len(),
                config.groups.iter().map(|g| g.members.len()).sum::<usize>(),
                config.routes.len()
            );
        }
        Command::Stats { config, pin_dir, json, watch, interval } => {
            let pin_dir = match (config, pin_dir) {
                (Some(path), _) => Config::load(&path)?.dataplane.pin_dir,
                (None, Some(dir)) => dir,
                (None, None) => PathBuf::from(rocev2_common::maps::PIN_DIR),
            };
            privileges::require("stats", Need::PinnedMaps(&pin_dir))?;
            if watch {
                if !(interval > 0.0 && interval.is_finite()) {
                    anyhow::bail!("--interval must be a positive number of seconds, not {interval}");
                }
                return watch::watch(&pin_dir, std::time::Duration::from_secs_f64(interval), None);
            }
            let state = RunState::read(&pin_dir)?;
            let maps = Maps::open_pinned(&pin_dir)?;
            let snapshot = Snapshot::collect(&maps, &state)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&snapshot).context("cannot encode JSON")?);
            } else {
                print!("{}", snapshot.render());
            }
        }
        Command::Demo { qps, packets_per_qp, uplinks } => {
            privileges::require("demo", Need::Namespaces)?;
            privileges::require("demo", Need::LoadXdp)?;
            rocev2_user::lab::demo(qps, packets_per_qp, uplinks)?;
        }
        Command::Reload { config, pin_dir } => {
            let pin_dir = match (config, pin_dir) {
                (Some(path), _) => Config::load(&path)?.dataplane.pin_dir,
                (None, Some(dir)) => dir,
                (None, None) => PathBuf::from(rocev2_common::maps::PIN_DIR),
            };
            privileges::require("reload", Need::PinnedMaps(&pin_dir))?;
            let outcome = run::request_reload(&pin_dir, std::time::Duration::from_secs(30))?;
            println!("rocev2: reloaded {}", outcome.display());
        }
        Command::Lab { command } => {
            privileges::require(command.as_typed(), Need::Namespaces)?;
            labcmd::run(&command)?
        }
        Command::Gen(args) => {
            privileges::require("gen", Need::RawSockets)?;
            if args.mode == gen::GenMode::LiveFrames {
                privileges::require("gen --mode live-frames", Need::LoadXdp)?;
            }
            gen::run(&args)?;
        }
        Command::Sink(args) => {
            privileges::require("sink", Need::RawSockets)?;
            sink::run(&args)?;
        }
        Command::Entropy(args) => entropy::run(&args)?,
        Command::Explain(args) => explain::run(&args)?,
        Command::Bench(args) => rocev2_user::bench::run(&args)?,
    }
    Ok(())
}
