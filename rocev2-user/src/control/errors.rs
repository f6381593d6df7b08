//! Typed errors at the dataplane boundary: what the kernel maps cannot
//! take, said with the numbers an operator needs. Callers that can act on
//! one (the kernel-route path leaves routes that do not fit to the kernel)
//! match on it; the CLI prints it through anyhow like any other error.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
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
}
