//! The tools' eBPF object (`rocev2-tools`): the live-frames generator's
//! transmit program, the lab's fault injector, and the benchmark's floor,
//! FIB peer and receiver. It has its own maps, so a tool never touches the
//! state of a dataplane that `rocev2 run` loaded; `run` never loads it.

use anyhow::{bail, Context, Result};
use aya::{
    maps::{Array, DevMap, DevMapHash, HashMap, MapData},
    programs::{SchedClassifier, Xdp},
    Ebpf, EbpfLoader,
};
use rocev2_common::maps::{names, GenRewrite};

use crate::control::dataplane::add_redirect_target;

/// Sends every frame back out (XDP_TX), restoring MACs and TTL first: the
/// live-frames traffic generator.
pub const XDP_TX_PROGRAM: &str = "rocev2_xdp_tx";
/// Drops chosen (DestQP, PSN) packets: the lab's fault injector.
pub const FAULT_PROGRAM: &str = "rocev2_xdp_fault";
/// The fault injector on a link's egress (tc).
pub const TC_FAULT_PROGRAM: &str = "rocev2_tc_fault";
/// Redirects every frame, unparsed, to EGRESS_DEVS key 0: the benchmark floor.
pub const XDP_REDIRECT_PROGRAM: &str = "rocev2_xdp_redirect";
/// Forwards IPv4 with `bpf_fib_lookup()`: the benchmark's peer (xdp-forward's method).
pub const XDP_FIB_PROGRAM: &str = "rocev2_xdp_fib";
/// Drops every frame: the benchmark's receivers (counted from rx counters).
pub const XDP_DROP_PROGRAM: &str = "rocev2_xdp_drop";
/// Counts and sequence-checks the RoCEv2 frames landing on a device, then
/// passes them on: the lab's arrival probe (testbed::arrival).
pub const XDP_ARRIVAL_PROGRAM: &str = "rocev2_xdp_arrival";
/// The same, then drops the RoCEv2 frames and passes the rest (a receiver
/// no application listens on; it still answers ARP and ND).
pub const XDP_ARRIVAL_DROP_PROGRAM: &str = "rocev2_xdp_arrival_drop";

/// One loaded instance of the tools object. Programs are verified on first
/// use, so an instance costs only what it runs.
pub struct ToolPrograms {
    ebpf: Ebpf,
    /// Where the floor and the FIB peer redirect to (taken out of `ebpf`:
    /// both are written together).
    egress_devs_direct: DevMap<MapData>,
    egress_devs: DevMapHash<MapData>,
}

impl ToolPrograms {
    pub fn load() -> Result<Self> {
        if crate::TOOLS_OBJECT.is_empty() {
            bail!("this rocev2 binary was built with AYA_BUILD_SKIP=1 and carries no eBPF programs; rebuild without it (cargo xtask build)");
        }
        crate::sys::privileges::check()?;
        let mut ebpf = EbpfLoader::new().load(crate::TOOLS_OBJECT).context("cannot load the tools' eBPF object")?;
        let mut take = |name: &str| ebpf.take_map(name).with_context(|| format!("the tools' object has no map {name}"));
        let egress_devs_direct = DevMap::try_from(take(names::EGRESS_DEVS_DIRECT)?)?;
        let egress_devs = DevMapHash::try_from(take(names::EGRESS_DEVS)?)?;
        Ok(Self { ebpf, egress_devs_direct, egress_devs })
    }

    /// Program `name`, loaded into the kernel (once).
    pub fn xdp(&mut self, name: &str) -> Result<&mut Xdp> {
        let program: &mut Xdp = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("the tools' eBPF object has no program {name}"))?
            .try_into()
            .with_context(|| format!("{name} is not an XDP program"))?;
        if program.fd().is_err() {
            crate::sys::verifier::load(name, || program.load())?;
        }
        Ok(program)
    }

    /// tc program `name`, loaded into the kernel (once).
    pub fn tc(&mut self, name: &str) -> Result<&mut SchedClassifier> {
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(name)
            .with_context(|| format!("the tools' eBPF object has no program {name}"))?
            .try_into()
            .with_context(|| format!("{name} is not a tc classifier"))?;
        if program.fd().is_err() {
            crate::sys::verifier::load(name, || program.load())?;
        }
        Ok(program)
    }

    /// Makes the generator's XDP_TX program restore these MACs and TTL in
    /// every frame it sends.
    pub fn set_gen_rewrite(&mut self, dst_mac: [u8; 6], src_mac: [u8; 6], ttl: u8) -> Result<()> {
        let map = self.ebpf.map_mut(names::GEN_REWRITE).context("the tools' object has no map GEN_REWRITE")?;
        let mut table: Array<&mut MapData, GenRewrite> = Array::try_from(map)?;
        let entry = GenRewrite { dst_mac, src_mac, ttl, enabled: 1, _reserved: [0; 2] };
        table.set(0, entry, 0).context("cannot write GEN_REWRITE")
    }

    /// Lets the FIB peer redirect to `ifindex` (in the device map the
    /// pipeline would use for it). Device-map entries resolve ifindexes in
    /// the caller's network namespace.
    pub fn add_egress_dev(&mut self, ifindex: u32) -> Result<()> {
        Ok(add_redirect_target(&mut self.egress_devs_direct, &mut self.egress_devs, ifindex)?)
    }

    /// Points the floor (EGRESS_DEVS_DIRECT index 0; no real ifindex is 0)
    /// at `ifindex`.
    pub fn set_floor_target(&mut self, ifindex: u32) -> Result<()> {
        self.egress_devs_direct.set(0, ifindex, None, 0).context("cannot set the floor's redirect target")
    }

    /// The fault injector's table: (DestQP << 32 | PSN) -> drops to come.
    pub fn fault_drops(&mut self) -> Result<HashMap<&mut MapData, u64, u32>> {
        let map = self.ebpf.map_mut(names::FAULT_DROPS).context("the tools' object has no map FAULT_DROPS")?;
        Ok(HashMap::try_from(map)?)
    }

    /// A map of this instance by name (the arrival probe's maps).
    pub fn map(&self, name: &str) -> Result<&aya::maps::Map> {
        self.ebpf.map(name).with_context(|| format!("the tools' object has no map {name}"))
    }

    /// The same, writable.
    pub fn map_mut(&mut self, name: &str) -> Result<&mut aya::maps::Map> {
        self.ebpf.map_mut(name).with_context(|| format!("the tools' object has no map {name}"))
    }

    /// Read-only view of the fault injector's table.
    pub fn fault_drops_view(&self) -> Result<HashMap<&MapData, u64, u32>> {
        let map = self.ebpf.map(names::FAULT_DROPS).context("the tools' object has no map FAULT_DROPS")?;
        Ok(HashMap::try_from(map)?)
    }
}
