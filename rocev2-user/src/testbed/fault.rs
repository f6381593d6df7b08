//! The lab's fault injector: the tools object's fault program on one
//! interface, dropping (or corrupting: the last byte before the ICRC
//! flipped) chosen RoCEv2 packets by (DestQP, PSN) a chosen number of times
//! and passing everything else: as XDP on what arrives (`attach`), as tc
//! on what leaves (`attach_egress`). Attached in the calling thread's
//! network namespace; detached when dropped.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use aya::programs::{tc, TcAttachType, XdpMode};
use rocev2_common::{
    bth::PSN_MASK,
    maps::{fault_key, FAULT_CORRUPT, FAULT_COUNT_MASK, MAX_FAULTS},
};

use crate::{
    sys::signals::SigintGuard,
    tools::programs::{ToolPrograms, FAULT_PROGRAM, TC_FAULT_PROGRAM},
};

pub struct PsnDropper {
    programs: ToolPrograms,
}

impl PsnDropper {
    /// Attaches to `dev`'s ingress, dropping each `(dest_qp, psn, times)`
    /// that many times.
    pub fn attach(dev: &str, drops: &[(u32, u32, u32)]) -> Result<Self> {
        Self::attach_faults(dev, drops, &[])
    }

    /// Like [`PsnDropper::attach`], also corrupting each of `corrupts`
    /// that many times.
    pub fn attach_faults(dev: &str, drops: &[(u32, u32, u32)], corrupts: &[(u32, u32, u32)]) -> Result<Self> {
        let mut programs = Self::load(drops, corrupts)?;
        let program = programs.xdp(FAULT_PROGRAM)?;
        program.attach(dev, XdpMode::Driver).with_context(|| format!("cannot attach the fault injector to {dev}"))?;
        Ok(Self { programs })
    }

    /// Like [`PsnDropper::attach`] on what `dev` transmits (tc egress).
    pub fn attach_egress(dev: &str, drops: &[(u32, u32, u32)]) -> Result<Self> {
        Self::attach_egress_faults(dev, drops, &[])
    }

    /// Like [`PsnDropper::attach_faults`] on what `dev` transmits (tc egress).
    pub fn attach_egress_faults(dev: &str, drops: &[(u32, u32, u32)], corrupts: &[(u32, u32, u32)]) -> Result<Self> {
        let mut programs = Self::load(drops, corrupts)?;
        // An existing clsact qdisc is fine.
        let _ = tc::qdisc_add_clsact(dev);
        let program = programs.tc(TC_FAULT_PROGRAM)?;
        program
            .attach(dev, TcAttachType::Egress)
            .with_context(|| format!("cannot attach the fault injector to {dev}'s egress"))?;
        Ok(Self { programs })
    }

    /// The tools object with FAULT_DROPS filled.
    fn load(drops: &[(u32, u32, u32)], corrupts: &[(u32, u32, u32)]) -> Result<ToolPrograms> {
        if drops.len() + corrupts.len() > MAX_FAULTS as usize {
            bail!("at most {MAX_FAULTS} (QP, PSN) faults, not {}", drops.len() + corrupts.len());
        }
        let mut seen = std::collections::HashSet::new();
        let mut programs = ToolPrograms::load()?;
        {
            let mut table = programs.fault_drops()?;
            let faults = drops.iter().map(|&d| (d, 0)).chain(corrupts.iter().map(|&c| (c, FAULT_CORRUPT)));
            for ((qp, psn, times), kind) in faults {
                if qp > PSN_MASK || psn > PSN_MASK {
                    bail!("QP {qp:#x} / PSN {psn:#x} does not fit in 24 bits");
                }
                if times > FAULT_COUNT_MASK {
                    bail!("QP {qp:#x} PSN {psn}: at most {FAULT_COUNT_MASK} times, not {times}");
                }
                if !seen.insert((qp, psn)) {
                    bail!("QP {qp:#x} PSN {psn} is named twice: drop it or corrupt it, once");
                }
                table.insert(fault_key(qp, psn), times | kind, 0).context("filling FAULT_DROPS")?;
            }
        }
        Ok(programs)
    }

    /// Faults still to come for `(dest_qp, psn)` (0 once all happened).
    pub fn remaining(&self, dest_qp: u32, psn: u32) -> Result<u32> {
        let table = self.programs.fault_drops_view()?;
        Ok(table.get(&fault_key(dest_qp, psn), 0).unwrap_or(0) & FAULT_COUNT_MASK)
    }
}

/// `rocev2 fault`: lose or corrupt chosen RoCEv2 packets on an interface
/// of this machine (or of `--netns`), for experiments with the RC tools,
/// real RDMA stacks and the switch's transport telemetry.
#[derive(clap::Args, Debug, Clone)]
pub struct FaultArgs {
    /// Interface to lose the packets on.
    #[arg(long)]
    pub dev: String,
    /// A packet to lose: DESTQP:PSN, or DESTQP:PSN:TIMES to lose each of its
    /// first TIMES transmissions (default 1). QP and PSN in decimal or 0x hex.
    #[arg(long = "drop", value_name = "QP:PSN[:TIMES]", required_unless_present = "corrupts", value_parser = parse_drop)]
    pub drops: Vec<(u32, u32, u32)>,
    /// A packet to corrupt (its last byte before the ICRC flipped, which
    /// the receiver's ICRC check must catch), written like --drop.
    #[arg(long = "corrupt", value_name = "QP:PSN[:TIMES]", value_parser = parse_drop)]
    pub corrupts: Vec<(u32, u32, u32)>,
    /// Lose them as the interface sends (tc egress) instead of as it
    /// receives (XDP).
    #[arg(long)]
    pub egress: bool,
    /// Give up after this many seconds (default: wait until every drop
    /// happened, or Ctrl-C).
    #[arg(long)]
    pub duration: Option<f64>,
}

/// Parses `QP:PSN[:TIMES]`.
fn parse_drop(s: &str) -> Result<(u32, u32, u32), String> {
    let number = |t: &str| match t.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => t.parse(),
    };
    let parts: Vec<&str> = s.split(':').collect();
    let bad = || format!("{s:?} is not QP:PSN or QP:PSN:TIMES (e.g. 0x100:5 or 0x100:5:2)");
    let (qp, psn, times) = match parts[..] {
        [qp, psn] => (qp, psn, "1"),
        [qp, psn, times] => (qp, psn, times),
        _ => return Err(bad()),
    };
    let (Ok(qp), Ok(psn), Ok(times)) = (number(qp), number(psn), number(times)) else { return Err(bad()) };
    if qp > PSN_MASK || psn > PSN_MASK {
        return Err(format!("{s:?}: QP and PSN are 24-bit numbers (at most 0xffffff)"));
    }
    Ok((qp, psn, times))
}

/// Attaches, waits until every fault happened (or the duration, or
/// Ctrl-C), prints what was lost and corrupted, detaches.
pub fn run(args: &FaultArgs) -> Result<()> {
    let dropper = if args.egress {
        PsnDropper::attach_egress_faults(&args.dev, &args.drops, &args.corrupts)?
    } else {
        PsnDropper::attach_faults(&args.dev, &args.drops, &args.corrupts)?
    };
    let hook = if args.egress { "as it sends (tc egress)" } else { "as it receives (XDP)" };
    let to_lose: u32 = args.drops.iter().map(|d| d.2).sum();
    let to_corrupt: u32 = args.corrupts.iter().map(|d| d.2).sum();
    let what = match (to_lose, to_corrupt) {
        (_, 0) => format!("{to_lose} to lose"),
        (0, _) => format!("{to_corrupt} to corrupt"),
        _ => format!("{to_lose} to lose, {to_corrupt} to corrupt"),
    };
    eprintln!("rocev2 fault: on {} {hook}, {what}; Ctrl-C to stop", args.dev);
    let _sigint = SigintGuard::install();
    let started = Instant::now();
    let all = || args.drops.iter().chain(&args.corrupts);
    let remaining = |d: &PsnDropper| -> Result<u32> { all().map(|&(qp, psn, _)| d.remaining(qp, psn)).sum() };
    loop {
        let left = remaining(&dropper)?;
        let out_of_time = args.duration.is_some_and(|secs| started.elapsed().as_secs_f64() >= secs);
        if left == 0 || out_of_time || SigintGuard::interrupted() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut lines = Vec::new();
    let (mut lost, mut corrupted) = (0, 0);
    for (verb, list, total) in [("lost", &args.drops, &mut lost), ("corrupted", &args.corrupts, &mut corrupted)] {
        for &(qp, psn, times) in list {
            let done = times - dropper.remaining(qp, psn)?;
            *total += done;
            lines.push(format!("  QP {qp:#x} PSN {psn}: {verb} {done} of {times}"));
        }
    }
    let summary = match (to_lose, to_corrupt) {
        (_, 0) => format!("lost {lost} of {to_lose}"),
        (0, _) => format!("corrupted {corrupted} of {to_corrupt}"),
        _ => format!("lost {lost} of {to_lose}, corrupted {corrupted} of {to_corrupt}"),
    };
    println!("rocev2 fault on {}: {summary}\n{}", args.dev, lines.join("\n"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_parse_with_and_without_times() {
        assert_eq!(parse_drop("0x100:5"), Ok((0x100, 5, 1)));
        assert_eq!(parse_drop("256:0x10:3"), Ok((256, 16, 3)));
        assert!(parse_drop("0x100").unwrap_err().contains("QP:PSN"));
        assert!(parse_drop("0x1000000:1").unwrap_err().contains("24-bit"));
    }
}
