//! Testbeds: the veth lab of the demo and tests (`lab`), `rocev2 lab
//! up|down|status` (`labcmd`), FRR per namespace (`frr`), the benchmark, and
//! the one topology builder they all use (`topology`).

pub mod bench;
pub mod debian_tree;
pub mod fault;
pub mod frr;
pub mod guest;
pub mod lab;
pub mod labcmd;
pub mod topology;
