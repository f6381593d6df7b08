//! `rocev2 lab up --routing bgp`: FRR (zebra + bgpd) on the RTSW and on
//! every spine, eBGP over every RTSW-spine link with one private ASN per
//! switch (RFC 7938), `maximum-paths` on the RTSW. The spines advertise the
//! destination prefixes; the RTSW's rocev2 follows the kernel routes zebra
//! installs (`[routing] source = "kernel"`).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

use super::{DEST_PREFIX_V4, DEST_PREFIX_V6};
use crate::testbed::frr::{bgp_config, Frr};

/// The RTSW's ASN; spine j has RTSW_ASN + 100 + j.
pub const RTSW_ASN: u32 = 65000;

/// One switch's BGP speaker.
#[derive(Clone, Debug)]
pub struct BgpSpeaker {
    pub netns: String,
    pub config: String,
}

/// The sessions of one RTSW-spine link: (RTSW end, spine end) addresses.
pub struct LinkAddrs {
    pub spine: u32,
    pub rtsw: Vec<String>,
    pub far: Vec<String>,
}

pub fn spine_asn(j: u32) -> u32 {
    RTSW_ASN + 100 + j
}

/// The frr.conf of the RTSW and of every spine.
pub fn speakers(
    rtsw: &str,
    spine_ns: impl Fn(u32) -> String,
    links: &[LinkAddrs],
    v4: bool,
    v6: bool,
) -> Vec<BgpSpeaker> {
    let mut rtsw_peers = Vec::new();
    let mut spines: std::collections::BTreeMap<u32, Vec<(String, String)>> = Default::default();
    for l in links {
        for (near, far) in l.rtsw.iter().zip(&l.far) {
            rtsw_peers.push((far.clone(), spine_asn(l.spine).to_string()));
            spines.entry(l.spine).or_default().push((near.clone(), RTSW_ASN.to_string()));
        }
    }
    let mut networks = Vec::new();
    if v4 {
        networks.push(DEST_PREFIX_V4);
    }
    if v6 {
        networks.push(DEST_PREFIX_V6);
    }
    let mut out =
        vec![BgpSpeaker { netns: rtsw.to_string(), config: bgp_config(RTSW_ASN, "10.255.0.1", &rtsw_peers, &[]) }];
    for (j, peers) in spines {
        out.push(BgpSpeaker {
            netns: spine_ns(j),
            config: bgp_config(spine_asn(j), &format!("10.255.0.{}", 10 + j), &peers, &networks),
        });
    }
    out
}

/// Where a speaker's FRR keeps its sockets and pid files.
pub fn state_dir(run_dir: &Path, netns: &str) -> PathBuf {
    run_dir.join(format!("frr-{netns}"))
}

/// Waits until namespace `ns`'s kernel route to `prefix` has `paths` next hops.
pub fn wait_paths(ns: &str, prefix: &str, paths: usize, deadline: Instant) -> Result<()> {
    loop {
        let family = if prefix.contains(':') { "-6" } else { "-4" };
        let shown = crate::sys::netns::ip(&["-n", ns, family, "route", "show", prefix]).unwrap_or_default();
        if shown.matches(" via ").count() >= paths || (paths == 1 && shown.contains(" via ")) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("BGP did not converge in time: {ns}'s route {prefix} is {shown:?}, wanted {paths} path(s)");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Starts every speaker (left running for `lab down` to stop) and waits
/// until the RTSW's kernel has `paths` next hops for the destination
/// prefixes. Returns a line saying how long that took.
pub fn start(speakers: &[BgpSpeaker], run_dir: &Path, paths: usize, v4: bool, v6: bool) -> Result<String> {
    let started = Instant::now();
    for s in speakers {
        Frr::start_in(&s.netns, &state_dir(run_dir, &s.netns), &s.config)?.detach();
    }
    let rtsw = &speakers[0].netns;
    let deadline = started + Duration::from_secs(60);
    let mut waiting: Vec<&str> = Vec::new();
    if v4 {
        waiting.push(DEST_PREFIX_V4);
    }
    if v6 {
        waiting.push(DEST_PREFIX_V6);
    }
    for prefix in waiting {
        wait_paths(rtsw, prefix, paths, deadline)?;
    }
    let mut line = String::new();
    let _ = write!(
        line,
        "BGP converged in {:.1} s: {} speakers, the RTSW has {paths} path(s) to the destination",
        started.elapsed().as_secs_f64(),
        speakers.len()
    );
    Ok(line)
}
