//! Reading the dataplane's per-QP transport telemetry (see
//! rocev2_common::telemetry) from the maps a running `rocev2 run` pinned:
//! the QP table for `rocev2 top`, the per-member sums for `stats` and the
//! metrics.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

use anyhow::{Context, Result};
use aya::{
    maps::{Array, MapData, PerCpuArray},
    Ebpf,
};
use rocev2_common::{
    maps::{member_stat_index, Pin, MAPS},
    telemetry::{names, MemberTransport, QpSlot, QpStats},
};
use serde::Serialize;

/// Pins the maps the table pins with telemetry on (`Pin::WithTelemetry`)
/// under `dir`, replacing stale pins of a crashed run.
pub fn pin_maps(ebpf: &mut Ebpf, dir: &Path) -> Result<()> {
    for map in MAPS.iter().filter(|m| m.pin == Pin::WithTelemetry) {
        let (name, path) = (map.name, dir.join(map.name));
        let _ = std::fs::remove_file(&path);
        let map = ebpf.map_mut(name).with_context(|| format!("eBPF object has no map {name}"))?;
        map.pin(&path).with_context(|| format!("cannot pin map {name} at {}", path.display()))?;
    }
    Ok(())
}

/// True if the running dataplane under `dir` has telemetry on.
pub fn is_on(dir: &Path) -> bool {
    dir.join(names::QP_TELEMETRY).exists()
}

pub fn open(dir: &Path, name: &str) -> Result<aya::maps::Map> {
    let path = dir.join(name);
    let data = MapData::from_pin(&path).with_context(|| {
        format!(
            "cannot open {}: is `rocev2 run` running with telemetry on (`telemetry_qps` in [dataplane])?",
            path.display()
        )
    })?;
    aya::maps::Map::from_map_data(data).with_context(|| format!("pinned map {} has an unknown type", path.display()))
}

/// One data QP as the table holds it.
#[derive(Clone, Debug, Serialize)]
pub struct QpEntry {
    /// The data's source and UDP source port.
    pub src: IpAddr,
    pub src_port: u16,
    pub dst: IpAddr,
    pub dest_qp: u32,
    pub stats: QpStats,
}

/// The dataplane's words for an address (rocev2_common::hash).
pub fn addr_words(a: IpAddr) -> [u32; 4] {
    match a {
        IpAddr::V4(v4) => rocev2_common::hash::ipv4_words(v4.octets()),
        IpAddr::V6(v6) => rocev2_common::hash::ipv6_words(&v6.octets()),
    }
}

/// An address as the dataplane's words hold it (rocev2_common::hash).
pub fn words_addr(words: &[u32; 4], family: u32) -> IpAddr {
    if family == 6 {
        let mut b = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            b[i * 4..i * 4 + 4].copy_from_slice(&w.to_ne_bytes());
        }
        Ipv6Addr::from(b).into()
    } else {
        Ipv4Addr::from(words[0].to_ne_bytes()).into()
    }
}

/// The QP table's slots in use (a slot's key has a family), as the
/// dataplane holds them (rocev2_common::telemetry::QpSlot).
fn used_slots(dir: &Path) -> Result<Vec<QpSlot>> {
    let map: Array<_, QpSlot> = Array::try_from(open(dir, names::QP_TELEMETRY)?).with_context(|| {
        format!(
            "{} under {} has an unexpected type (a dataplane older than this rocev2 pinned it?)",
            names::QP_TELEMETRY,
            dir.display()
        )
    })?;
    let mut out = Vec::new();
    for i in 0..map.len() {
        let slot = map.get(&i, 0).with_context(|| format!("reading {} slot {i}", names::QP_TELEMETRY))?;
        if slot.key.family != 0 {
            out.push(slot);
        }
    }
    Ok(out)
}

/// Every QP in the table (at most its size).
pub fn read_qps(dir: &Path) -> Result<Vec<QpEntry>> {
    Ok(used_slots(dir)?.into_iter().map(entry).collect())
}

/// A table slot as a QP.
pub fn entry(slot: QpSlot) -> QpEntry {
    let (k, s) = (slot.key, slot.stats);
    QpEntry {
        src: words_addr(&s.src, k.family),
        src_port: s.src_port as u16,
        dst: words_addr(&k.dst, k.family),
        dest_qp: k.dest_qp,
        stats: s,
    }
}

/// QPs in the table now.
pub fn count_qps(dir: &Path) -> Result<usize> {
    Ok(used_slots(dir)?.len())
}

/// The per-member sums, summed over CPUs, for a group's first `members`
/// positions.
pub fn read_members(dir: &Path, group: u32, members: u32) -> Result<Vec<MemberTransport>> {
    MemberTransportReader::default().read(dir, group, members)
}

/// MEMBER_TRANSPORT for a caller that reads it again and again (the health
/// step, every 100 ms): the pinned map is opened on the first read, and
/// again only after a read failed.
#[derive(Default)]
pub struct MemberTransportReader {
    map: Option<PerCpuArray<MapData, MemberTransport>>,
}

impl MemberTransportReader {
    /// Like [`read_members`].
    pub fn read(&mut self, dir: &Path, group: u32, members: u32) -> Result<Vec<MemberTransport>> {
        let map = match &mut self.map {
            Some(map) => map,
            None => self.map.insert(
                PerCpuArray::try_from(open(dir, names::MEMBER_TRANSPORT)?)
                    .context("MEMBER_TRANSPORT has an unexpected type")?,
            ),
        };
        let sums: Result<Vec<MemberTransport>> = (0..members)
            .map(|position| {
                let per_cpu = map.get(&member_stat_index(group, position), 0).context("reading MEMBER_TRANSPORT")?;
                let mut sum = MemberTransport::default();
                for m in per_cpu.iter() {
                    sum.add(m);
                }
                Ok(sum)
            })
            .collect();
        if sums.is_err() {
            self.map = None;
        }
        sums
    }
}

/// One QP as `top` shows it (and the collision detector reads it).
#[derive(Clone, Debug, Serialize)]
pub struct TopRow {
    /// The data's source and UDP source port (None when not known).
    pub src: Option<IpAddr>,
    pub src_port: u16,
    pub dst: IpAddr,
    pub dest_qp: u32,
    pub group: String,
    /// The member (device) carrying the QP's data.
    pub member: String,
    /// Over the last refresh interval.
    pub pps: f64,
    pub bits_per_sec: f64,
    /// The table's counters for the QP (packets, bytes, PSN jumps, NAKs...).
    #[serde(flatten)]
    pub stats: QpStats,
    /// Seconds since its last data packet.
    pub idle_secs: f64,
}

impl TopRow {
    pub fn trouble(&self) -> u64 {
        self.stats.trouble()
    }
}
