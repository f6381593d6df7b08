//! Part 5: how long `rocev2 lab up --racks` takes to build a 4-rack x
//! 4-host x 4-spine fabric (24 namespaces, 32 veth pairs, `rocev2 run` on
//! all eight switches, each ready), with static routes and with BGP (FRR
//! on every switch, converged before the dataplanes start).

use std::{path::Path, process::Command, time::Instant};

use anyhow::{bail, Context as _, Result};

use super::{median, row, Row};

const ROUNDS: usize = 3;

pub(super) fn part5(rocev2: &Path, notes: &mut Vec<String>) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for routing in ["static", "bgp"] {
        let mut seconds = Vec::new();
        for round in 0..ROUNDS {
            // Lab names are at most 8 characters.
            let name = format!("bf{}{round}", std::process::id() % 10_000);
            #[rustfmt::skip]
            let args = ["lab", "up", "--name", &name, "--racks", "4", "--hosts", "4", "--spines", "4", "--routing", routing];
            let started = Instant::now();
            let up = Command::new(rocev2).args(args).output().context("cannot run rocev2 lab up")?;
            let took = started.elapsed().as_secs_f64();
            let down = Command::new(rocev2).args(["lab", "down", "--name", &name]).output();
            if !up.status.success() {
                bail!("lab up --routing {routing} failed: {}", String::from_utf8_lossy(&up.stderr));
            }
            if !down.as_ref().is_ok_and(|d| d.status.success()) {
                bail!("lab down --name {name} failed: {down:?}");
            }
            seconds.push(took);
        }
        let worst = seconds.iter().copied().fold(0.0, f64::max);
        rows.push(row(
            "5 fabric",
            format!("`lab up`: 4 racks x 4 hosts x 4 spines, {routing}"),
            "8 switches running rocev2, 16 hosts, IPv4 + IPv6",
            format!("{:.1} s", median(seconds)),
            format!("worst of {ROUNDS}: {worst:.1} s"),
            "< 60 s",
        ));
    }
    notes.push(format!(
        "Part 5: wall time of `rocev2 lab up --racks 4 --hosts 4 --spines 4 --routing static|bgp` until every switch's `rocev2 run` printed its ready line (with BGP: after every leaf had 4 paths to every other rack); median of {ROUNDS}, each followed by `lab down`."
    ));
    Ok(rows)
}
