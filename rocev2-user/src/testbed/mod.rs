//! Testbeds: the veth lab of the demo and tests (`ecmp_lab`), `rocev2 lab
//! up|down|status|traffic|stats` (`lab`), FRR per namespace (`frr`), the
//! benchmark, and the one topology builder they all use (`topology`).

pub mod arrival;
pub mod bench;
pub mod debian_tree;
pub mod ecmp_lab;
pub mod fault;
pub mod frr;
pub mod guest;
pub mod lab;
pub mod topology;
