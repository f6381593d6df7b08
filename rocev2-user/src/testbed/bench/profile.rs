//! `rocev2 bench --profile PIPELINE`: where one pipeline's per-packet time
//! goes, source line by source line.
//!
//! The part-1 measurement runs in a loop on one CPU while `perf record`
//! samples that CPU with call chains. Each sample of the loop's thread is
//! charged to a source line through the kernel's JIT line table
//! (jit_lines.rs): a sample in the program to the line of the instruction
//! it hit, a sample in a kernel function the program called (a map
//! lookup, a helper) to the line that made the call. Inlined library code
//! (core, aya-ebpf) is charged to the rocev2 line that called it and named
//! beside it. perf's cpu-clock samples every 1/SAMPLE_HZ s, so a line's
//! samples times 100 µs, over the packets run meanwhile, is its ns per
//! packet (the budgets of BENCHMARKS.md place each row's remainder on
//! lines with it: placement.rs).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    os::fd::AsFd as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use nix::{
    sys::signal::{kill, Signal},
    unistd::{gettid, Pid},
};

use super::{
    bench_frame, budget, cost_ns_frames, cost_ns_repeat,
    jit_lines::{Callee, JitLines},
    median, test_run_floor, BenchArgs, Pipeline, Programs, PIPELINES, XDP_PROGRAM,
};
use crate::{tools::gen::CpuPin, tools::programs::XDP_REDIRECT_PROGRAM};

/// Samples per second per CPU (perf's cpu-clock, a timer: it works in VMs
/// without hardware counters).
const SAMPLE_HZ: u32 = 10_000;
/// Program runs per measurement inside the loop (one ns reading each).
const BATCH: u64 = 20_000;
/// Rows the report shows before the rest is summed up.
pub const REPORT_ROWS: usize = 25;

/// The kernel function that runs a test run's loop: a sample under it and
/// outside the program is the harness (clock reads, the XDP dispatcher,
/// the run's set-up), which the floor pays as well.
const MEASURED_WINDOW: &str = "bpf_test_run";

/// The report's section before the profiles.
pub const HEADING: &str = "
## Where the time goes

Made by `rocev2 bench --profile PIPELINE`: the pipeline's part-1
measurement (IPv4, 10 routes) runs in a loop on the last CPU while
`perf record -e cpu-clock -g` samples that CPU. A sample in the program is
charged to the source line of the instruction it hit, through the kernel's
JIT line table (the program's BTF line info and the JIT address of each
line record); a sample in a kernel function the program called (a hash map
lookup, a helper) to the line that called it; inlined library code (core,
aya-ebpf) to the nearest rocev2 line before it (usually its caller; line
info has no inlining chain), named beside it; a sample in the first line
record of a BPF function other than the main one (where the JIT puts the
function's prologue) is shown as that function's entry, and a sample at
the instruction a call returns to (a call found in the JITed machine code)
is charged to the call: to the BPF function's return, or to the kernel
function it called. `xlated insns` is
the number of BPF instructions of the sampled line records (as
`bpftool prog dump xlated linum` shows them). cpu-clock samples every
100 µs of the CPU's time, so a line's ns per packet is its samples times
100 µs over the packets run while perf sampled; the heading's ns per
packet is what the kernel measured meanwhile (higher than part 1's: the
sampling interrupts run inside its window). These are the profiles of two
budget rows above; each budget places its remainder with its own.
";

/// What runs at a sampled place besides the rocev2 line itself.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Detail {
    /// The line's own instructions.
    Own,
    /// An inlined library line (`core/src/option.rs:1226 `match self {``).
    Library(String),
    /// A kernel function the line called (`__htab_map_lookup_elem`).
    Kernel(String),
    /// The first line record of a BPF function other than the program's
    /// main one: the JIT's prologue of a BPF-to-BPF call lands there.
    Entry,
    /// The instruction a BPF-to-BPF call returns to (charged to the call's
    /// line): where the return's misprediction shows.
    Return,
}

/// One row of the profile: a rocev2 source line and what ran there.
#[derive(Clone, Debug, PartialEq)]
pub struct LineCost {
    /// `rocev2-ebpf/src/parse.rs:83`
    pub location: String,
    pub text: String,
    pub detail: Detail,
    pub samples: u64,
    /// xlated instructions of the sampled line records (0 for kernel calls).
    pub insns: u32,
}

/// A sampled call chain, innermost frame first: (address, symbol).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub tid: i32,
    pub frames: Vec<(u64, String)>,
}

#[derive(Debug, Default)]
pub struct Profile {
    pub label: String,
    /// The kernel's ns per program run during the profile (median of batches).
    pub measured_ns: f64,
    /// Program runs while perf sampled (all batches).
    pub packets: u64,
    pub rows: Vec<LineCost>,
    /// Samples in the program or in what it called.
    pub program_samples: u64,
    /// Samples under bpf_test_run outside the program (the harness).
    pub harness_samples: u64,
    /// Samples in the program's code before its first line record.
    pub lineless_samples: u64,
    /// Samples of the loop's thread outside bpf_test_run (the syscall,
    /// copying the frame, user space).
    pub outside_samples: u64,
    pub seconds: f64,
}

/// Charges each sample of thread `tid` to a line of `jit` (see the module
/// comment).
pub fn attribute(samples: &[Sample], tid: i32, jit: &JitLines) -> Profile {
    let mut rows: BTreeMap<(String, Detail), LineCost> = BTreeMap::new();
    // (row, line record) pairs whose instructions a row already counts.
    let mut counted_records: BTreeSet<((String, Detail), usize)> = BTreeSet::new();
    let mut profile = Profile::default();
    for sample in samples.iter().filter(|s| s.tid == tid) {
        let Some(k) = sample.frames.iter().position(|(ip, _)| jit.contains(*ip)) else {
            if sample.frames.iter().any(|(_, sym)| sym == MEASURED_WINDOW) {
                profile.harness_samples += 1;
            } else {
                profile.outside_samples += 1;
            }
            continue;
        };
        let ip = sample.frames[k].0;
        // Above the innermost frame the address is a return address: the
        // call is the instruction before it. So is a sample right where a
        // call returns to: its time is the return's (a mispredicted one
        // stalls there), charged to the call and what it called.
        let returned_from = if k == 0 { jit.returned_from(ip) } else { None };
        let Some(index) = jit.line_at(if k == 0 && returned_from.is_none() { ip } else { ip - 1 }) else {
            profile.lineless_samples += 1;
            continue;
        };
        profile.program_samples += 1;
        let owner = jit.line(jit.owner(index));
        let hit = jit.line(index);
        let detail = if k > 0 {
            Detail::Kernel(sample.frames[k - 1].1.clone())
        } else if let Some(callee) = returned_from {
            match callee {
                Callee::Function(_) => Detail::Return,
                Callee::Kernel(name) => Detail::Kernel(name.clone()),
            }
        } else if jit.is_subprogram_entry(index) {
            Detail::Entry
        } else if hit.is_own() {
            Detail::Own
        } else {
            Detail::Library(format!("{} `{}`", hit.location(), hit.text))
        };
        let key = (owner.location(), detail.clone());
        let row = rows.entry(key.clone()).or_insert_with(|| LineCost {
            location: owner.location(),
            text: owner.text.clone(),
            detail: detail.clone(),
            samples: 0,
            insns: 0,
        });
        row.samples += 1;
        if !matches!(detail, Detail::Kernel(_) | Detail::Return) && counted_records.insert((key, index)) {
            row.insns += hit.insns;
        }
    }
    profile.rows = rows.into_values().collect();
    profile.rows.sort_by(|a, b| b.samples.cmp(&a.samples).then_with(|| a.location.cmp(&b.location)));
    profile
}

/// Parses `perf script -F tid,ip,sym` output of a call-chain recording.
pub fn parse_perf_script(text: &str) -> Vec<Sample> {
    let mut samples = Vec::new();
    let mut current: Option<Sample> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            samples.extend(current.take());
        } else if !line.starts_with('\t') && trimmed.bytes().all(|b| b.is_ascii_digit()) {
            samples.extend(current.take());
            current = Some(Sample { tid: trimmed.parse().unwrap_or(-1), frames: Vec::new() });
        } else if let Some(sample) = current.as_mut() {
            let (ip, sym) = trimmed.split_once(' ').unwrap_or((trimmed, ""));
            if let Ok(ip) = u64::from_str_radix(ip, 16) {
                sample.frames.push((ip, sym.trim().to_owned()));
            }
        }
    }
    samples.extend(current);
    samples
}

/// Profiles `pipeline` for `seconds` on the last CPU.
pub fn profile(pipeline: Pipeline, v6: bool, seconds: f64) -> Result<Profile> {
    let mut dp = pipeline.test_run_dataplane()?;
    let frame = bench_frame(v6, 255, [2, 0, 0, 0, 0, 0xFE]);
    let label = format!("{}, {}", pipeline.name(), if v6 { "IPv6" } else { "IPv4" });
    profile_program(&mut dp, XDP_PROGRAM, &[&frame], &label, seconds)
}

/// Profiles `program` of `programs` for `seconds` on the last CPU, taking
/// `frames` in turn (one per test-run call, as part 1 measures it).
pub fn profile_program(
    programs: &mut impl Programs,
    program: &str,
    frames: &[&[u8]],
    label: &str,
    seconds: f64,
) -> Result<Profile> {
    let perf = which_perf()?;
    let jit = JitLines::of_program(programs.program(program)?.fd()?.as_fd())?;
    let cpu = std::thread::available_parallelism().map_or(0, |n| n.get() - 1);
    let _pin = CpuPin::new(cpu)?;
    // Warm the program and its maps before sampling starts.
    cost_ns_frames(programs, program, frames, BATCH, 1)?;
    let mut recorder = Recorder::start(&perf, cpu)?;
    let started = Instant::now();
    let mut batches = Vec::new();
    while started.elapsed().as_secs_f64() < seconds {
        batches.push(cost_ns_frames(programs, program, frames, BATCH, 1)?);
    }
    let sampled = started.elapsed().as_secs_f64();
    let samples = recorder.finish()?;
    let mut profile = attribute(&samples, gettid().as_raw(), &jit);
    if profile.program_samples == 0 {
        bail!("no sample fell inside the program ({} samples in all): is the BPF JIT on?", samples.len());
    }
    profile.label = label.to_owned();
    profile.packets = batches.len() as u64 * BATCH;
    profile.measured_ns = median(batches);
    profile.seconds = sampled;
    Ok(profile)
}

/// `perf record` sampling one CPU with call chains, until finished or
/// dropped; its data file is removed either way.
struct Recorder {
    perf: PathBuf,
    child: Child,
    data: PathBuf,
}

impl Recorder {
    fn start(perf: &Path, cpu: usize) -> Result<Self> {
        let data = std::env::temp_dir().join(format!("rocev2-profile-{}.perf.data", std::process::id()));
        let child = Command::new(perf)
            .args(["record", "--quiet", "-e", "cpu-clock", "-g", "-F", &SAMPLE_HZ.to_string(), "-C", &cpu.to_string()])
            .arg("-o")
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {}", perf.display()))?;
        let recorder = Self { perf: perf.to_owned(), child, data };
        // perf writes its file's header once the events are set up.
        let started = Instant::now();
        while !recorder.data.exists() {
            if started.elapsed() > Duration::from_secs(5) {
                bail!("perf record did not start within 5 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200));
        Ok(recorder)
    }

    /// Stops the recording and reads its samples.
    fn finish(&mut self) -> Result<Vec<Sample>> {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT);
        let mut errors = String::new();
        if let Some(mut stderr) = self.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut stderr, &mut errors);
        }
        self.child.wait().context("waiting for perf record")?;
        let script = Command::new(&self.perf)
            .args(["script", "-F", "tid,ip,sym", "-i"])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
            .context("perf script")?;
        if !script.status.success() || script.stdout.is_empty() {
            bail!("perf recorded nothing: {}", errors.trim());
        }
        Ok(parse_perf_script(&String::from_utf8_lossy(&script.stdout)))
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGINT);
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.data);
    }
}

/// `--loop`: one pipeline's part-1 measurement over and over, for a
/// profiler attached from outside (`perf record -a -g`).
pub fn profile_loop(args: &BenchArgs, name: &str) -> Result<()> {
    if name == "floor" {
        return measure_in_a_loop(args, &mut test_run_floor()?, XDP_REDIRECT_PROGRAM, "floor");
    }
    let pipeline = PIPELINES
        .into_iter()
        .find(|p| p.short_name() == name)
        .with_context(|| format!("--loop: unknown pipeline {name:?} (floor, five-tuple, qp, flowlet, full)"))?;
    let label = format!("{} {}", pipeline.name(), if args.loop_v6 { "IPv6" } else { "IPv4" });
    measure_in_a_loop(args, &mut pipeline.test_run_dataplane()?, XDP_PROGRAM, &label)
}

fn measure_in_a_loop(args: &BenchArgs, programs: &mut impl Programs, program: &str, label: &str) -> Result<()> {
    let frame = bench_frame(args.loop_v6, 255, [2, 0, 0, 0, 0, 0xFE]);
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < args.loop_seconds {
        let ns = cost_ns_repeat(programs, program, &frame, args.packets, args.loop_repeat)?;
        println!("{label}: {ns:.1} ns");
    }
    Ok(())
}

/// `perf` from linux-perf (`cargo xtask setup` installs it).
fn which_perf() -> Result<PathBuf> {
    ["/usr/bin/perf", "/usr/local/bin/perf", "/usr/sbin/perf"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .context("--profile needs perf (Debian: apt-get install linux-perf; `cargo xtask setup` installs it)")
}

/// `--profile NAME`: the tools program a name gives, if it names the
/// floor (`floor`) or a primitive (its program, `rocev2_prim_...`).
pub fn tools_program_named(name: &str) -> Option<&'static str> {
    if name == "floor" {
        return Some(XDP_REDIRECT_PROGRAM);
    }
    budget::Primitive::ALL.into_iter().map(budget::Primitive::program).find(|p| *p == name)
}

/// `--profile NAME`: the pipeline a name gives.
pub fn pipeline_named(name: &str) -> Result<Pipeline> {
    PIPELINES.into_iter().find(|p| p.short_name() == name).with_context(|| {
        let names: Vec<_> = PIPELINES.iter().map(|p| p.short_name()).collect();
        format!(
            "--profile: unknown pipeline {name:?} (one of {}; or floor, or a primitive's program)",
            names.join(", ")
        )
    })
}

fn markdown_code(text: &str) -> String {
    let mut t: String = text.chars().take(70).collect::<String>().replace('`', "'").replace('|', "\\|");
    if text.chars().count() > 70 {
        t.push('…');
    }
    format!("`{t}`")
}

impl Profile {
    /// ns per packet one sample stands for: perf's cpu-clock samples the
    /// CPU every 1/SAMPLE_HZ s (a timer, not a count of events), so a
    /// sample is 1e9/SAMPLE_HZ ns of the loop's time, spread over the
    /// packets run meanwhile.
    pub fn ns_per_sample(&self) -> f64 {
        1e9 / f64::from(SAMPLE_HZ) / self.packets.max(1) as f64
    }

    /// The profile as a Markdown section: the `top` lines, the rest
    /// summed, then the cost by file.
    pub fn render(&self, top: usize) -> String {
        let per = self.ns_per_sample();
        let window = self.program_samples + self.harness_samples;
        let share = |n: u64| 100.0 * n as f64 / window.max(1) as f64;
        let mut s = String::new();
        let _ = writeln!(s, "### {}: {:.1} ns per packet\n", self.label, self.measured_ns);
        let _ = writeln!(
            s,
            "{} samples in {:.1} s under the test run ({} packets): {} in the program and the kernel functions it calls ({:.1} ns per packet), {} in the test-run harness ({:.1} ns: clock reads, dispatcher, set-up; the floor pays them too). {} more samples of the loop fell outside it (syscall, frame copy).\n",
            window,
            self.seconds,
            self.packets,
            self.program_samples,
            self.program_samples as f64 * per,
            self.harness_samples,
            self.harness_samples as f64 * per,
            self.outside_samples,
        );
        s.push_str("| ns | share | rocev2 line | what runs there | xlated insns |\n|---|---|---|---|---|\n");
        for row in self.rows.iter().take(top) {
            let what = match &row.detail {
                Detail::Own => String::new(),
                Detail::Library(line) => {
                    let (location, text) = line.split_once(' ').unwrap_or((line, ""));
                    format!("inlined {location} {}", markdown_code(text.trim_matches('`')))
                }
                Detail::Kernel(function) => format!("call: kernel `{function}`"),
                Detail::Entry => "the BPF function's entry (prologue)".to_owned(),
                Detail::Return => "the return from the BPF function it calls".to_owned(),
            };
            let insns = if row.insns == 0 { String::new() } else { row.insns.to_string() };
            let _ = writeln!(
                s,
                "| {:.1} | {:.1}% | {} {} | {what} | {insns} |",
                row.samples as f64 * per,
                share(row.samples),
                row.location,
                markdown_code(&row.text),
            );
        }
        let rest: u64 = self.rows.iter().skip(top).map(|r| r.samples).sum();
        if rest > 0 {
            let _ = writeln!(
                s,
                "| {:.1} | {:.1}% | {} more lines |  |  |",
                rest as f64 * per,
                share(rest),
                self.rows.len() - top
            );
        }
        let mut by_file: BTreeMap<&str, u64> = BTreeMap::new();
        for row in &self.rows {
            let file = row.location.rsplit_once(':').map_or(row.location.as_str(), |(f, _)| f);
            *by_file.entry(file).or_default() += row.samples;
        }
        let mut by_file: Vec<_> = by_file.into_iter().collect();
        by_file.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        s.push_str("\nBy file: ");
        let files: Vec<String> =
            by_file.iter().map(|(file, n)| format!("{file} {:.1} ns ({:.0}%)", *n as f64 * per, share(*n))).collect();
        s.push_str(&files.join(", "));
        s.push_str(".\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testbed::bench::jit_lines::JitLine;

    fn line(addr: u64, file: &str, line: u32, text: &str) -> JitLine {
        JitLine { addr, insn: addr as u32, insns: 3, file: file.into(), line, text: text.into() }
    }

    const SCRIPT: &str = "\
 7 
\tffffffffc0000010 bpf_prog_aa_rocev2_xdp
\tffffffff81f0930a bpf_test_run
\tffffffff81f0ad2b bpf_prog_test_run_xdp

 7 
\tffffffffc0000022 bpf_prog_aa_rocev2_xdp
\tffffffff81f0930a bpf_test_run

 7 
\tffffffff81234567 __htab_map_lookup_elem
\tffffffffc0000031 bpf_prog_aa_rocev2_xdp
\tffffffff81f0930a bpf_test_run

 7 
\tffffffff81e93ed5 bpf_dispatcher_xdp_func
\tffffffff81f0930a bpf_test_run

 7 
\tffffffff81f0aa65 bpf_prog_test_run_xdp
\tffffffff814ddf21 __sys_bpf

 8 
\tffffffffc0000010 bpf_prog_aa_rocev2_xdp
";

    #[test]
    fn samples_are_charged_to_lines_calls_and_the_harness() {
        let base = 0xffff_ffff_c000_0000;
        let jit = JitLines::new(
            vec![base..base + 0x40, base + 0x100..base + 0x140],
            vec![
                line(base, "rocev2-ebpf/src/parse.rs", 83, "if start > end {"),
                line(base + 0x20, "core/src/option.rs", 1226, "match self {"),
                line(base + 0x30, "rocev2-ebpf/src/maps.rs", 81, "GROUPS.get(id)"),
            ],
        );
        let samples = parse_perf_script(SCRIPT);
        assert_eq!(samples.len(), 6);
        assert_eq!(samples[2].frames[0], (0xffff_ffff_8123_4567, "__htab_map_lookup_elem".to_owned()));
        let p = attribute(&samples, 7, &jit);
        assert_eq!((p.program_samples, p.harness_samples, p.outside_samples), (3, 1, 1), "thread 8 is not ours");
        let row = |loc: &str, detail: Detail| {
            p.rows.iter().find(|r| r.location == loc && r.detail == detail).map(|r| (r.samples, r.insns))
        };
        assert_eq!(row("rocev2-ebpf/src/parse.rs:83", Detail::Own), Some((1, 3)));
        assert_eq!(
            row("rocev2-ebpf/src/parse.rs:83", Detail::Library("core/src/option.rs:1226 `match self {`".into())),
            Some((1, 3)),
            "inlined library code is charged to the rocev2 line before it"
        );
        // The return address 0x31 is after the call at 0x30.
        assert_eq!(row("rocev2-ebpf/src/maps.rs:81", Detail::Kernel("__htab_map_lookup_elem".into())), Some((1, 0)));
        let mut p = p;
        p.measured_ns = 100.0;
        // 1e9 / 10,000 Hz / 4,000 packets: 25 ns per sample.
        p.packets = 4_000;
        p.label = "test".into();
        let text = p.render(REPORT_ROWS);
        assert!(text.contains("| 25.0 | 25.0% | rocev2-ebpf/src/maps.rs:81 `GROUPS.get(id)` | call: kernel `__htab_map_lookup_elem` |  |"), "{text}");
        assert!(text.contains("rocev2-ebpf/src/parse.rs 50.0 ns (50%)"), "{text}");
    }

    #[test]
    fn a_sample_where_a_call_returns_is_the_call_s() {
        let base = 0xffff_ffff_c000_0000;
        let mut jit = JitLines::new(
            vec![base..base + 0x20, base + 0x20..base + 0x40],
            vec![
                line(base, "rocev2-ebpf/src/forward.rs", 89, "forward_v4_call(ctx)"),
                line(base + 0x08, "rocev2-ebpf/src/forward.rs", 92, "if code == FORWARDED {"),
                line(base + 0x20, "rocev2-ebpf/src/forward.rs", 103, "fn forward_v4_call"),
            ],
        );
        // base + 3: call base + 0x20 (the second function); returns to base + 8.
        let mut code = vec![0x90u8; 0x40];
        code[3..8].copy_from_slice(&[0xE8, 0x18, 0, 0, 0]);
        jit.find_calls(&code, |_| None);
        let at = |ip: u64| Sample { tid: 7, frames: vec![(ip, "bpf_prog_x".into()), (0, "bpf_test_run".into())] };
        let p = attribute(&[at(base + 8), at(base + 9), at(base + 0x20)], 7, &jit);
        let row = |loc: &str, detail: Detail| {
            p.rows.iter().find(|r| r.location == loc && r.detail == detail).map(|r| r.samples)
        };
        assert_eq!(row("rocev2-ebpf/src/forward.rs:89", Detail::Return), Some(1), "the return, at the call's line");
        assert_eq!(
            row("rocev2-ebpf/src/forward.rs:92", Detail::Own),
            Some(1),
            "the next instruction is the line's own"
        );
        assert_eq!(row("rocev2-ebpf/src/forward.rs:103", Detail::Entry), Some(1));
    }
}
