//! One module per scenario, each with a `run` (or `run_*`) that the runner in `main.rs` lists.
//! Scenarios share the control plane and the GPU pool, run one after another, and leave the pool
//! as they found it.

pub mod admission;
pub mod chaos;
pub mod failure;
pub mod gate;
pub mod harvest;
pub mod keda_loop;
pub mod keda_push;
pub mod notice;
pub mod packing;
pub mod preemption;
pub mod rbac;
pub mod scrape;
pub mod takeover;
