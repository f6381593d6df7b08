//! Typed errors where callers decide.
//!
//! [`DataplaneError`]: what the maps could not take (with the numbers an
//! operator needs) or a map operation the kernel refused. Every write to
//! the dataplane's maps returns it; a reload tells the kinds apart by it
//! ([`ReloadError`]), and `Dataplane::install_route` turns the kernel's
//! "no space" into [`DataplaneError::RouteTableFull`] by matching it.
//!
//! [`ReloadError`]: why a reload did not apply (the running config stays);
//! `rocev2 run` records its [`RefusalReason`] in the state file
//! (`control::state::ReloadOutcome`), and `rocev2 reload` returns it as
//! [`ReloadRefused`], which a caller (a lab deciding between a reload and
//! a restart) can match on. `anyhow` is for the CLI edge, which prints them.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::control::config::ConfigError;

#[derive(Debug, Error)]
pub enum DataplaneError {
    #[error("route table full: {installed} of {capacity} {family} routes installed, cannot add {prefix}; aggregate prefixes or leave some to the kernel")]
    RouteTableFull { family: &'static str, installed: usize, capacity: u32, prefix: String },
    #[error("group slot {group} is out of range: the dataplane has {capacity} group slots")]
    GroupSlotOutOfRange { group: u32, capacity: u32 },
    #[error("a group of {members} members is larger than the {capacity} a group can hold")]
    TooManyMembers { members: usize, capacity: u32 },
    #[error("{classes} classes are more than the {capacity} the dataplane matches")]
    TooManyClasses { classes: usize, capacity: u32 },
    #[error("{what} slot {slot} is out of range: the dataplane has {capacity}")]
    SlotOutOfRange { what: &'static str, slot: u32, capacity: u32 },
    /// A bucket table names a position the group does not have (a bug in
    /// the caller: nothing is written).
    #[error("bucket table names member {member} of a group of {members}")]
    InvalidBuckets { member: u8, members: usize },
    /// Pins of a `rocev2 run` from before the map existed (read by a newer
    /// `stats` or `explain`).
    #[error("these pins have no {map} map (a rocev2 run from before {feature})")]
    MissingMap { map: &'static str, feature: &'static str },
    /// A map operation the kernel refused; `what` says which, the source
    /// (aya's error, with the syscall's) says why.
    #[error("{what}")]
    Map {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl DataplaneError {
    /// The kernel refused a write for want of room (ENOSPC): a full table.
    pub fn is_no_space(&self) -> bool {
        let DataplaneError::Map { source, .. } = self else { return false };
        let first: &(dyn std::error::Error + 'static) = source.as_ref();
        std::iter::successors(Some(first), |e| e.source())
            .any(|e| e.downcast_ref::<std::io::Error>().is_some_and(|io| io.raw_os_error() == Some(libc::ENOSPC)))
    }
}

/// `.context("cannot write GROUPS")` for map operations: the failure as a
/// [`DataplaneError::Map`].
pub(crate) trait MapResult<T> {
    fn context(self, what: &str) -> Result<T, DataplaneError>;
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T, DataplaneError>;
}

impl<T, E: std::error::Error + Send + Sync + 'static> MapResult<T> for Result<T, E> {
    fn context(self, what: &str) -> Result<T, DataplaneError> {
        self.map_err(|e| DataplaneError::Map { what: what.to_string(), source: Box::new(e) })
    }

    fn with_context(self, what: impl FnOnce() -> String) -> Result<T, DataplaneError> {
        self.map_err(|e| DataplaneError::Map { what: what(), source: Box::new(e) })
    }
}

/// Why a reload did not apply: the running config stays.
#[derive(Debug, Error)]
pub enum ReloadError {
    /// The file does not read, parse or validate.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// It changes settings fixed when the programs were loaded and attached.
    /// Each setting says what changed, e.g. `dataplane.xdp_mode changed`.
    #[error("{}; that needs a restart of `rocev2 run`", .settings.join("; "))]
    NeedsRestart { settings: Vec<String> },
    /// It turns on load-time features the running programs were loaded
    /// without; each named with what in the file asks for it.
    #[error("the new config turns on {}, which the running programs were loaded without (each feature is compiled in at load time so unused ones cost nothing); restart `rocev2 run` to load it: a new run takes over the attached programs without dropping traffic", .features.join("; "))]
    FeaturesNotLoaded { features: Vec<String> },
    /// The dataplane's maps could not take it: a [`DataplaneError`], with
    /// where it happened ([`ReloadError::dataplane`] gives the typed one).
    #[error("{0:#}")]
    Dataplane(anyhow::Error),
    /// Anything else on the way (links, neighbours, addresses).
    #[error("{0:#}")]
    System(anyhow::Error),
}

impl ReloadError {
    /// Sorts an error of the apply step: the dataplane's own, a config
    /// problem found at run time (a member's link), or the system's.
    pub fn from_apply(e: anyhow::Error) -> Self {
        if e.downcast_ref::<DataplaneError>().is_some() {
            return ReloadError::Dataplane(e);
        }
        match e.downcast::<ConfigError>() {
            Ok(c) => ReloadError::Config(c),
            Err(e) => ReloadError::System(e),
        }
    }

    /// The dataplane's error, when that is what refused the reload.
    pub fn dataplane(&self) -> Option<&DataplaneError> {
        match self {
            ReloadError::Dataplane(e) => e.downcast_ref(),
            _ => None,
        }
    }

    pub fn reason(&self) -> RefusalReason {
        match self {
            ReloadError::Config(_) => RefusalReason::Config,
            ReloadError::NeedsRestart { .. } => RefusalReason::NeedsRestart,
            ReloadError::FeaturesNotLoaded { .. } => RefusalReason::FeaturesNotLoaded,
            ReloadError::Dataplane(_) => RefusalReason::Dataplane,
            ReloadError::System(_) => RefusalReason::System,
        }
    }
}

/// The kind of a refused reload, as the state file records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RefusalReason {
    Config,
    NeedsRestart,
    FeaturesNotLoaded,
    Dataplane,
    System,
    /// Recorded by a `rocev2 run` from before reasons were recorded.
    Unknown,
}

impl RefusalReason {
    /// True when restarting `rocev2 run` with the file would apply it
    /// (the file itself is fine).
    pub fn restart_applies(self) -> bool {
        matches!(self, RefusalReason::NeedsRestart | RefusalReason::FeaturesNotLoaded)
    }
}

/// `rocev2 reload`'s answer when `rocev2 run` refused the file.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("the reload failed and the running config stays: {message}")]
pub struct ReloadRefused {
    pub reason: RefusalReason,
    pub message: String,
}
