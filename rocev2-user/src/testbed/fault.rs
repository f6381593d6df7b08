//! The lab's fault injector: the dataplane object's `rocev2_xdp_fault`
//! program on one interface, dropping chosen RoCEv2 packets by (DestQP,
//! PSN) a chosen number of times and passing everything else. Attached in
//! the calling thread's network namespace; detached when dropped.

use anyhow::{bail, Context, Result};
use aya::{
    maps::HashMap,
    programs::{Xdp, XdpMode},
    Ebpf, EbpfLoader,
};
use rocev2_common::{
    bth::PSN_MASK,
    maps::{fault_key, names, MAX_FAULTS},
};

pub const FAULT_PROGRAM: &str = "rocev2_xdp_fault";

pub struct PsnDropper {
    ebpf: Ebpf,
}

impl PsnDropper {
    /// Attaches to `dev`, dropping each `(dest_qp, psn, times)` that many times.
    pub fn attach(dev: &str, drops: &[(u32, u32, u32)]) -> Result<Self> {
        if crate::EBPF_OBJECT.is_empty() {
            bail!("this rocev2 binary was built with AYA_BUILD_SKIP=1 and carries no eBPF programs");
        }
        if drops.len() > MAX_FAULTS as usize {
            bail!("at most {MAX_FAULTS} (QP, PSN) drops, not {}", drops.len());
        }
        let mut ebpf = EbpfLoader::new().load(crate::EBPF_OBJECT).context("cannot load the eBPF object")?;
        {
            let mut table: HashMap<_, u64, u32> =
                HashMap::try_from(ebpf.map_mut(names::FAULT_DROPS).context("eBPF object has no map FAULT_DROPS")?)?;
            for &(qp, psn, times) in drops {
                if qp > PSN_MASK || psn > PSN_MASK {
                    bail!("QP {qp:#x} / PSN {psn:#x} does not fit in 24 bits");
                }
                table.insert(fault_key(qp, psn), times, 0).context("filling FAULT_DROPS")?;
            }
        }
        let program: &mut Xdp = ebpf
            .program_mut(FAULT_PROGRAM)
            .with_context(|| format!("eBPF object has no program {FAULT_PROGRAM}"))?
            .try_into()?;
        program.load().context("the kernel rejected the fault injector")?;
        program.attach(dev, XdpMode::Driver).with_context(|| format!("cannot attach the fault injector to {dev}"))?;
        Ok(Self { ebpf })
    }

    /// Drops still to come for `(dest_qp, psn)` (0 once all happened).
    pub fn remaining(&self, dest_qp: u32, psn: u32) -> Result<u32> {
        let table: HashMap<_, u64, u32> =
            HashMap::try_from(self.ebpf.map(names::FAULT_DROPS).context("no FAULT_DROPS")?)?;
        Ok(table.get(&fault_key(dest_qp, psn), 0).unwrap_or(0))
    }
}
