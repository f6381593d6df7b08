//! `rocev2 entropy --racks N`: the simulator over a whole fabric. Every
//! packet the lab's generators would send is walked through the leaves and
//! spines with the dataplane's own hash and buckets ([`Fabric::predict`]),
//! so a lab built with the same flags (`rocev2 lab up --racks N ...`)
//! counts exactly these loads on its links. `--sweep` prints the teaching
//! table: QPs per connection against five-tuple / qp / flowlet hashing
//! with one seed on every switch or each switch's own.

use anyhow::{bail, Context as _, Result};
use rocev2_common::hash::HashMode;

use super::{parse_sweep, EntropyArgs, SimHash};
use crate::{
    render::{Align, Table},
    tools::fabric::{flag, picture, render_loads, summarize, Fabric, SeedPlan, Tier, TierSummary, TrafficSpec},
    tools::gen::SportModel,
};

fn sport(args: &EntropyArgs) -> SportModel {
    match args.sport {
        super::SportModel::Fixed => SportModel::Fixed,
        super::SportModel::Nic => SportModel::Nic,
        super::SportModel::Random => SportModel::Random,
    }
}

fn fabric(args: &EntropyArgs, racks: u32, hash: SimHash, seeds: SeedPlan) -> Result<Fabric> {
    let f = Fabric {
        racks,
        hosts: args.hosts,
        spines: args.spines,
        links: args.links_per_spine,
        v4: args.family.v4(),
        v6: args.family.v6(),
        hash: if hash == SimHash::FiveTuple { HashMode::FiveTuple } else { HashMode::Qp },
        hash_version: args.hash_version,
        seeds,
        zones: args.zones,
        aggs: crate::tools::fabric::aggs_for(args.zones, args.aggs)?,
    };
    f.validate()?;
    Ok(f)
}

/// Per-tier summaries of one simulated collective step.
pub fn simulate(f: &Fabric, spec: &TrafficSpec, flowlet: bool) -> Result<Vec<TierSummary>> {
    Ok(summarize(&f.all_links(), &f.predict_policy(spec, flowlet)?))
}

/// The busiest link over the mean of the switch tiers, whichever is worse:
/// a collective step ends when its busiest link does.
pub fn worst_factor(tiers: &[TierSummary]) -> f64 {
    tiers.iter().filter(|t| t.tier != Tier::LeafDown).map(|t| t.max_over_mean).fold(0.0, f64::max)
}

pub fn run(args: &EntropyArgs, racks: u32) -> Result<()> {
    if !(1..=32).contains(&args.qps) || args.messages == 0 {
        bail!("--qps must be 1..=32 and --messages positive in fabric mode");
    }
    let spec = |qps: u32, messages: u32| TrafficSpec { pattern: args.pattern, qps, messages, sport: sport(args) };
    if let Some(text) = &args.sweep {
        if args.svg.is_some() {
            bail!("--svg draws one fabric (`entropy --racks N` without --sweep); a sweep over QP counts has no single picture");
        }
        let qps = parse_sweep(text)?;
        if qps.iter().any(|q| *q > 32) {
            bail!("--sweep QP counts must be at most 32 in fabric mode");
        }
        return sweep(args, racks, &qps, &spec);
    }
    let f = fabric(args, racks, args.hash, args.seeds)?;
    let s = spec(args.qps, args.messages);
    let loads = f.predict_policy(&s, args.hash == SimHash::Flowlet)?;
    if let Some(path) = &args.svg {
        // The same picture `lab stats --svg` draws from the counters.
        let flowlets = if args.hash == SimHash::Flowlet { " with flowlets" } else { "" };
        let title = format!("simulated link loads, {} QPs per connection{flowlets}", args.qps);
        std::fs::write(path, picture::svg(&f, &loads, &title))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.json {
        let links: Vec<_> = loads.iter().map(|(l, x)| serde_json::json!({ "link": l.to_string(), "tier": l.tier, "packets": x.packets, "bytes": x.bytes })).collect();
        let json =
            serde_json::json!({ "fabric": f, "spec": s, "links": links, "tiers": summarize(&f.all_links(), &loads) });
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    println!(
        "Simulated {} step: {} racks x {} hosts, {} spines x {} link(s), {} QPs x {} messages per connection, hash {}, seeds {}, sport {}",
        flag(args.pattern), racks, args.hosts, args.spines, args.links_per_spine, args.qps, args.messages, args.hash.name(), flag(args.seeds), flag(s.sport)
    );
    print!("{}", render_loads(&f, &loads));
    if let Some(path) = &args.svg {
        println!("picture written to {}", path.display());
    }
    Ok(())
}

fn sweep(args: &EntropyArgs, racks: u32, qps: &[u32], spec: &dyn Fn(u32, u32) -> TrafficSpec) -> Result<()> {
    let columns: Vec<(SimHash, SeedPlan)> =
        SimHash::ALL.iter().flat_map(|&h| [SeedPlan::Same, SeedPlan::Auto].map(move |s| (h, s))).collect();
    let headers: Vec<String> = std::iter::once("QPS".to_owned())
        .chain(columns.iter().map(|(h, s)| format!("{} {}", h.name(), flag(*s)).to_uppercase()))
        .collect();
    let spec_columns: Vec<(&str, Align)> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| (h.as_str(), if i == 0 { Align::Right } else { Align::Left }))
        .collect();
    let mut table = Table::new(&spec_columns);
    let mut json = Vec::new();
    for &q in qps {
        // The same bytes per connection whatever the QP count: messages split over the QPs.
        let messages = (args.messages / q).max(1);
        let mut row = vec![q.to_string()];
        for &(hash, seeds) in &columns {
            let f = fabric(args, racks, hash, seeds)?;
            let tiers = simulate(&f, &spec(q, messages), hash == SimHash::Flowlet)?;
            let worst = worst_factor(&tiers);
            row.push(format!("{worst:.2}x (+{:.0}%)", (worst - 1.0) * 100.0));
            json.push(serde_json::json!({ "qps": q, "hash": hash.name(), "seeds": seeds, "worst_max_over_mean": worst, "tiers": tiers }));
        }
        table.row(row);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    println!(
        "Simulated {} step over {racks} racks x {} hosts, {} spines x {} link(s), {} messages per connection split over its QPs, sport {}:\n\
         each cell is the busiest switch link over the mean (leaf->spine or spine->leaf, the worse), and in brackets how much\n\
         longer the step takes than with perfect balance (it ends when its busiest link does).",
        flag(args.pattern), args.hosts, args.spines, args.links_per_spine, args.messages, flag(sport(args))
    );
    print!("{}", table.render());
    Ok(())
}
