//! How an RC endpoint's requesters react to congestion (`--transport`):
//! a module of its own, so `gen` and `sink`, whose arguments name it, need
//! not import the endpoint, which uses them.

use serde::{Deserialize, Serialize};

/// How the requesters react to congestion.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Transport {
    /// Send whatever the window allows, ignore CNPs (loss is repaired by go-back-N).
    #[default]
    None,
    /// DCQCN: every QP's rate falls on CNPs and climbs back without them.
    Dcqcn,
    /// Receiver-driven admission: a message goes only once its receiver granted it (CTS).
    Cts,
}

impl Transport {
    pub fn name(self) -> &'static str {
        match self {
            Transport::None => "none",
            Transport::Dcqcn => "dcqcn",
            Transport::Cts => "cts",
        }
    }
}
