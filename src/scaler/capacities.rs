//! The scaler's learned capacities: one [`LearnedCapacity`] per ScaledObject whose trigger has
//! learned capacity (`capacity: learned`, the default of a trigger without targets), fed the
//! totals of each successful evaluation and asked for the token-rate targets of that same
//! evaluation.
//!
//! The learner is the pure [`crate::core::capacity`] model, the one the simulator runs; this module
//! owns the map of learners (dropped with the ScaledObject's other state when it is no longer
//! evaluated, or when its trigger stops learning) and what the explanation and the metrics show
//! of them. Nothing is persisted: after a restart each service learns again from its next
//! saturated readings, scaling on its queue meanwhile. A learner belongs to the service its
//! trigger reads ([`super::metadata::TriggerConfig::service`]): when the trigger is changed to
//! read another model or Service, the capacity learned of the old one is dropped and learning
//! starts again.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard},
};

use super::{explain::CapacityView, metrics::ScalerMetrics};
use crate::core::capacity::{CapacityConfig, LearnedCapacity, Throughput};

/// (namespace, name) of a ScaledObject.
type Key = (String, String);

/// One evaluation's totals (all summed over pods): pods reporting, requests waiting, prompt and
/// generated tokens per second.
pub type Reading = (usize, f64, f64, f64);

/// A ScaledObject's learner and the last reading it was fed.
struct Entry {
    /// The service of the trigger the learner learned from (`TriggerConfig::service`).
    service: u64,
    learner: LearnedCapacity,
    /// Evaluations within the sources' cache time (`GetMetrics`, `IsActive` and the stream of
    /// one ScaledObject) read the same totals: a reading equal to the last one is that same
    /// reading again and is not counted twice.
    last: Option<Reading>,
}

/// What a learner said in one evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Learned {
    /// Per-replica token-rate targets at the trigger's utilization; `None` before the first
    /// saturated sample. A rate never produced while saturated (zero capacity) has no target.
    pub prompt_target: Option<f64>,
    pub generated_target: Option<f64>,
}

/// The learners of every ScaledObject with learned capacity.
#[derive(Clone)]
pub struct Capacities {
    entries: Arc<Mutex<HashMap<Key, Entry>>>,
    config: CapacityConfig,
    metrics: ScalerMetrics,
}

impl Capacities {
    pub fn new(config: CapacityConfig, metrics: ScalerMetrics) -> Self {
        Self {
            entries: Arc::new(Mutex::new(HashMap::new())),
            config,
            metrics,
        }
    }

    /// Feeds one successful evaluation's totals to the ScaledObject's learner for `service`
    /// (`TriggerConfig::service` of its trigger; a learner of another service is replaced) and
    /// returns the targets at `utilization` with what the explanation shows.
    pub fn learn(
        &self,
        namespace: &str,
        name: &str,
        service: u64,
        utilization: f64,
        reading: Reading,
    ) -> (Learned, CapacityView) {
        let (pods, waiting, prompt, generated) = reading;
        let (per_replica, targets, samples, saturated) = {
            let mut entries = self.lock();
            let fresh = || Entry {
                service,
                learner: LearnedCapacity::new(self.config),
                last: None,
            };
            let entry = entries
                .entry((namespace.to_string(), name.to_string()))
                .and_modify(|e| {
                    if e.service != service {
                        *e = fresh();
                    }
                })
                .or_insert_with(fresh);
            let saturated = if entry.last == Some(reading) {
                false
            } else {
                entry.last = Some(reading);
                entry.learner.observe(pods, waiting, prompt, generated)
            };
            let learner = &entry.learner;
            (
                learner.per_replica(),
                learner.targets(utilization),
                learner.samples(),
                saturated,
            )
        };
        if let Some(c) = per_replica {
            self.metrics.learned_capacity(namespace, name, c, samples);
        }
        let usable = |t: f64| (t.is_finite() && t > 0.0).then_some(t);
        let learned = Learned {
            prompt_target: targets.and_then(|t| usable(t.prompt)),
            generated_target: targets.and_then(|t| usable(t.generated)),
        };
        let view = CapacityView {
            utilization,
            samples,
            sampled: saturated,
            per_replica,
            targets: targets.map(|t| Throughput {
                prompt: t.prompt,
                generated: t.generated,
            }),
            hand_set: Vec::new(),
            state: if per_replica.is_some() {
                format!(
                    "learned from {samples} saturated reading{}: token rates scale against {utilization} of it",
                    if samples == 1 { "" } else { "s" }
                )
            } else {
                "learning: scaling on the queue until requests wait".to_string()
            },
        };
        (learned, view)
    }

    /// Drops a ScaledObject's learner and its metrics.
    pub fn forget(&self, namespace: &str, name: &str) {
        let removed = {
            let mut entries = self.lock();
            // Called on every evaluation of a trigger without learned capacity: with no learner
            // at all, there is nothing to look up (and no key to build).
            !entries.is_empty()
                && entries
                    .remove(&(namespace.to_string(), name.to_string()))
                    .is_some()
        };
        if removed {
            self.metrics.forget_capacity(namespace, name);
        }
    }

    /// ScaledObjects with a learner.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no ScaledObject has a learner.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learns_per_scaled_object_and_forgets() {
        let c = Capacities::new(CapacityConfig::default(), ScalerMetrics::default());
        let (learned, view) = c.learn("a", "x", 1, 0.5, (2, 0.0, 100.0, 10.0));
        assert_eq!(learned.prompt_target, None);
        assert!(view.state.starts_with("learning"), "{}", view.state);
        let (learned, view) = c.learn("a", "x", 1, 0.5, (2, 4.0, 1000.0, 0.0));
        assert_eq!(learned.prompt_target, Some(250.0));
        // Never produced while saturated: no target rather than a zero one.
        assert_eq!(learned.generated_target, None);
        assert_eq!(view.samples, 1);
        assert!(view.sampled);
        // The same reading again (a cached pass read by another RPC) is not a second sample.
        let (_, again) = c.learn("a", "x", 1, 0.5, (2, 4.0, 1000.0, 0.0));
        assert_eq!((again.samples, again.sampled), (1, false));
        let (other, _) = c.learn("a", "y", 1, 0.5, (1, 0.0, 1.0, 1.0));
        assert_eq!(other.prompt_target, None);
        assert_eq!(c.len(), 2);
        c.forget("a", "x");
        c.forget("a", "x");
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn a_trigger_reading_another_service_learns_afresh() {
        let c = Capacities::new(CapacityConfig::default(), ScalerMetrics::default());
        let (learned, _) = c.learn("a", "x", 1, 0.5, (2, 4.0, 1000.0, 100.0));
        assert_eq!(learned.prompt_target, Some(250.0));
        // Same service: what was learned stays.
        let (learned, view) = c.learn("a", "x", 1, 0.5, (2, 0.0, 10.0, 1.0));
        assert_eq!((learned.prompt_target, view.samples), (Some(250.0), 1));
        // Another model behind the same ScaledObject: nothing of the old one is kept.
        let (learned, view) = c.learn("a", "x", 2, 0.5, (2, 0.0, 10.0, 1.0));
        assert_eq!((learned.prompt_target, view.samples), (None, 0));
        assert!(view.state.starts_with("learning"), "{}", view.state);
        assert_eq!(c.len(), 1);
    }
}
