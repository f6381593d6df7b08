//! The lab's fault injector: the tools object's fault program on one
//! interface, dropping chosen RoCEv2 packets by (DestQP, PSN) a chosen
//! number of times and passing everything else: as XDP on what arrives
//! (`attach`), as tc on what leaves (`attach_egress`). Attached in the
//! calling thread's network namespace; detached when dropped.

use anyhow::{bail, Context, Result};
use aya::programs::{tc, TcAttachType, XdpMode};
use rocev2_common::{
    bth::PSN_MASK,
    maps::{fault_key, MAX_FAULTS},
};

use crate::programs::{ToolPrograms, FAULT_PROGRAM, TC_FAULT_PROGRAM};

pub struct PsnDropper {
    programs: ToolPrograms,
}

impl PsnDropper {
    /// Attaches to `dev`'s ingress, dropping each `(dest_qp, psn, times)`
    /// that many times.
    pub fn attach(dev: &str, drops: &[(u32, u32, u32)]) -> Result<Self> {
        let mut programs = Self::load(drops)?;
        let program = programs.xdp(FAULT_PROGRAM)?;
        program.attach(dev, XdpMode::Driver).with_context(|| format!("cannot attach the fault injector to {dev}"))?;
        Ok(Self { programs })
    }

    /// Like [`PsnDropper::attach`] on what `dev` transmits (tc egress).
    pub fn attach_egress(dev: &str, drops: &[(u32, u32, u32)]) -> Result<Self> {
        let mut programs = Self::load(drops)?;
        // An existing clsact qdisc is fine.
        let _ = tc::qdisc_add_clsact(dev);
        let program = programs.tc(TC_FAULT_PROGRAM)?;
        program
            .attach(dev, TcAttachType::Egress)
            .with_context(|| format!("cannot attach the fault injector to {dev}'s egress"))?;
        Ok(Self { programs })
    }

    /// The tools object with FAULT_DROPS filled.
    fn load(drops: &[(u32, u32, u32)]) -> Result<ToolPrograms> {
        if drops.len() > MAX_FAULTS as usize {
            bail!("at most {MAX_FAULTS} (QP, PSN) drops, not {}", drops.len());
        }
        let mut programs = ToolPrograms::load()?;
        {
            let mut table = programs.fault_drops()?;
            for &(qp, psn, times) in drops {
                if qp > PSN_MASK || psn > PSN_MASK {
                    bail!("QP {qp:#x} / PSN {psn:#x} does not fit in 24 bits");
                }
                table.insert(fault_key(qp, psn), times, 0).context("filling FAULT_DROPS")?;
            }
        }
        Ok(programs)
    }

    /// Drops still to come for `(dest_qp, psn)` (0 once all happened).
    pub fn remaining(&self, dest_qp: u32, psn: u32) -> Result<u32> {
        let table = self.programs.fault_drops_view()?;
        Ok(table.get(&fault_key(dest_qp, psn), 0).unwrap_or(0))
    }
}
