//! Traffic and teaching tools: the RoCEv2 generator and sink, frame
//! building and ICRC, the RC requester and responder, the entropy
//! simulator and `explain`, and the eBPF programs the tools load.

pub mod collective;
pub mod entropy;
pub mod explain;
pub mod fabric;
pub mod gen;
pub mod packet;
pub mod programs;
pub mod rc;
pub mod sink;
