//! The environment the scenarios drive: one real control plane with a kwok GPU pool
//! ([`cluster`]), the real KEDA beside it ([`keda_stack`]), the nightshift binary ([`binary`])
//! deployed as a user deploys it ([`deploy`]), a vLLM source behind a real Prometheus
//! ([`source`]) and the shipped vLLM example under KEDA ([`example`]), and what the scenarios
//! share on top: research pods and their marks ([`research`]), the pool's marks and leadership
//! ([`pool`]), the projects' CRDs ([`crds`]), waits with deadlines ([`wait`]), the bounds on the
//! timings the README reports ([`bounds`]), child processes ([`process`]), a TCP proxy that can
//! be cut ([`proxy`]), Service endpoints written by hand ([`endpoints`]), object builders
//! ([`objects`]), preemption victims ([`victims`]) and the cluster's nodes as the simulator's
//! scheduler model sees them ([`model`]).

pub mod binary;
pub mod bounds;
pub mod cluster;
pub mod crds;
pub mod deploy;
pub mod endpoints;
pub mod example;
pub mod keda_stack;
pub mod model;
pub mod objects;
pub mod pool;
pub mod process;
pub mod proxy;
pub mod research;
pub mod source;
pub mod victims;
pub mod wait;
