//! The environment the scenarios drive: one real control plane with a kwok GPU pool
//! ([`cluster`]), the real KEDA beside it ([`keda_stack`]), the nightshift binary as deployed
//! ([`binary`]), a vLLM source behind a real Prometheus ([`source`]), and what the scenarios share
//! on top: waits with deadlines ([`wait`]), child processes ([`process`]), a TCP proxy that can be
//! cut ([`proxy`]), Service endpoints written by hand ([`endpoints`]), object builders
//! ([`objects`]) and preemption victims ([`victims`]).

pub mod binary;
pub mod cluster;
pub mod endpoints;
pub mod keda_stack;
pub mod objects;
pub mod process;
pub mod proxy;
pub mod source;
pub mod victims;
pub mod wait;
