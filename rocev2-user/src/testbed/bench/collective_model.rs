//! Part 6 of the benchmark: the collective model at the paper's scale.
//! `rocev2 entropy --collective` on 32,768 endpoints (2,048 racks of 16
//! hosts, 128 spines in 8 zones joined by 16 aggregation switches): a ring
//! AllReduce of 16 GiB per rank (4 chunks per hop, one per QP of 4) under the hashing modes, TE and flowlets,
//! each timed from the fabric's description to the prediction.

use std::time::Instant;

use anyhow::Result;
use rocev2_common::hash::HashMode;

use super::{median, row, Row};
use crate::tools::{
    collective::{
        model::{predict, Mode, Setup},
        Op, Placement, DEFAULT_CHUNK,
    },
    fabric::{Fabric, SeedPlan},
};

const ROUNDS: usize = 3;

/// The paper-scale fabric and collective under `mode`.
pub fn paper_scale(mode: Mode, qps: u32) -> Setup {
    Setup {
        fabric: Fabric {
            racks: 2048,
            hosts: 16,
            spines: 128,
            links: 1,
            zones: 8,
            aggs: 16,
            v4: true,
            v6: false,
            hash: HashMode::Qp,
            hash_version: rocev2_common::hash::HashVersion::V1,
            seeds: SeedPlan::Auto,
        },
        link_bps: 200_000_000,
        v6: false,
        op: Op::Allreduce,
        size: 16 << 30,
        qps,
        chunk: DEFAULT_CHUNK,
        placement: Placement::Interleaved,
        mode,
        flowlet_gap_ns: 2_000_000,
        flowlet_slots: rocev2_common::maps::DEFAULT_FLOWLET_SLOTS,
        message_gap_ns: 0,
    }
}

pub fn part6(notes: &mut Vec<String>) -> Result<Vec<Row>> {
    notes.push(format!(
        "Part 6 (collective model): `model::predict` timed in the bench process, one thread, median of {ROUNDS}; \
         each is what `rocev2 entropy --racks 2048 --hosts 16 --spines 128 --zones 8 --aggs 16 --collective allreduce \
         --size 16g --gaps 2ms --mode MODE [--qps 4]` prints (the round engine: every step's rounds with fixed paths, \
         flowlets sampled)."
    ));
    let mut rows = Vec::new();
    for (mode, qps) in [(Mode::FiveTuple, 1), (Mode::Qp, 4), (Mode::Te, 1), (Mode::FlowletKeyed, 1)] {
        let setup = paper_scale(mode, qps);
        let mut seconds = Vec::new();
        let mut share = 0.0;
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let p = predict(&setup).map_err(anyhow::Error::msg)?;
            seconds.push(started.elapsed().as_secs_f64());
            share = p.share_of_ideal;
        }
        let worst = seconds.iter().copied().fold(0.0, f64::max);
        rows.push(row(
            "6 model",
            format!("collective model, 32,768 endpoints: {} x{qps}", mode.name()),
            "ring AllReduce 16 GiB/rank, 2,048 racks x 16 hosts, 128 spines, 8 zones, 16 aggs",
            format!("{:.2} s", median(seconds)),
            format!("worst of {ROUNDS}: {worst:.2} s; predicts {:.0}% of ideal", share * 100.0),
            "< 10 s",
        ));
    }
    Ok(rows)
}
