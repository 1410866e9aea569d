//! The ground floor: nightshift's pure domain models, shared by the live components and the
//! simulator.
//!
//! Nothing here does I/O, reads a clock or knows of gRPC, HTTP or Kubernetes clients, and nothing
//! here imports a module of the crate outside this floor. What the scaler decides live and what
//! the simulator measures is therefore the same code.
//!
//! - [`demand`]: the composite demand math and the vLLM [`demand::Signal`]s.
//! - [`capacity`]: what one replica sustains, learned from the service's own metrics.
//! - [`forecast`]: a service's daily demand shape, by time of day and day of week.
//! - [`slo_loop`]: a service's utilization closed on the queue wait measured on it.
//! - [`notice`]: when inference will need more replicas, and which research pods the scheduler
//!   will preempt for them.
//! - [`vocabulary`]: the names the webhook and the pool share (labels, PriorityClasses, the GPU
//!   resource), set once for both.
//! - [`duration`]: human-friendly durations in flags and trigger metadata.

pub mod capacity;
pub mod demand;
pub mod duration;
pub mod forecast;
pub mod notice;
pub mod slo_loop;
pub mod vocabulary;
