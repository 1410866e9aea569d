//! Per-replica capacity learned from a service's own metrics: the prompt and generated tokens
//! per second one replica sustains while requests queue.
//!
//! Pure: no I/O, no clocks, nothing of the crate above it. The live scaler keeps one
//! [`LearnedCapacity`] per ScaledObject whose trigger asks for learned targets, and the simulator
//! runs the same code, so the trigger's default needs no per-model numbers: what a replica can
//! do is read off the replicas themselves.
//!
//! # Model
//!
//! While requests wait in vLLM's queue, every replica is busy: the token rates it reports then
//! are what it *can* do on this service's mix of prompt and output lengths. Each reading taken
//! with at least [`CapacityConfig::min_waiting_per_replica`] requests waiting per reporting pod
//! is a saturated sample: prompt and generated tokens per second, per pod. The capacity is a
//! high quantile ([`CapacityConfig::quantile`]) of the last [`CapacityConfig::samples`]
//! saturated samples: a replica that was saturated for only part of a rate window reports less
//! than it can do, never more, so the upper part of the samples is the better estimate, while a
//! quantile below the maximum keeps one odd reading from deciding. Memory is fixed.
//!
//! A trigger then scales each token rate against `utilization ×` its learned capacity (see
//! [`LearnedCapacity::targets`]): both ratios are 1 / utilization at saturation on the mix
//! learned, and the larger of the two over-estimates, never under-estimates, when the mix
//! shifts (a replica spends its time on prompts and outputs in proportion, so a mix with more of
//! one needs more than its own ratio says only of the other). Until a first saturated sample
//! there is no learned target: the trigger scales on its queue target alone, which is what
//! produces the first samples.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Tunables of the learner.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CapacityConfig {
    /// Saturated samples kept (the most recent). 64 readings at KEDA's 15–30 s polling span
    /// several saturated episodes, so one burst does not decide alone, and the estimate follows
    /// a new model or mix within a day of saturation.
    pub samples: usize,
    /// Waiting requests per reporting pod from which a reading counts as saturated. One: any
    /// request waiting behind each replica means none had room for it.
    pub min_waiting_per_replica: f64,
    /// Quantile of the saturated samples taken as the capacity (see the module docs).
    pub quantile: f64,
}

impl Default for CapacityConfig {
    fn default() -> Self {
        CapacityConfig {
            samples: 64,
            min_waiting_per_replica: 1.0,
            quantile: 0.75,
        }
    }
}

/// One saturated reading, per replica.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Throughput {
    /// Prompt tokens per second.
    pub prompt: f64,
    /// Generated tokens per second.
    pub generated: f64,
}

/// A service's learned per-replica capacity; fixed memory.
#[derive(Clone, Debug)]
pub struct LearnedCapacity {
    cfg: CapacityConfig,
    recent: VecDeque<Throughput>,
}

impl LearnedCapacity {
    pub fn new(cfg: CapacityConfig) -> LearnedCapacity {
        let cfg = CapacityConfig {
            samples: cfg.samples.clamp(1, 4096),
            min_waiting_per_replica: if cfg.min_waiting_per_replica.is_finite() {
                cfg.min_waiting_per_replica.max(0.0)
            } else {
                CapacityConfig::default().min_waiting_per_replica
            },
            quantile: if cfg.quantile.is_finite() {
                cfg.quantile.clamp(0.0, 1.0)
            } else {
                CapacityConfig::default().quantile
            },
        };
        LearnedCapacity {
            recent: VecDeque::with_capacity(cfg.samples),
            cfg,
        }
    }

    /// One reading of the service: pods reporting, requests waiting (summed over pods), prompt
    /// and generated tokens per second (summed over pods). Kept only when saturated; readings
    /// that are not finite and non-negative are ignored. Returns whether it was kept.
    pub fn observe(&mut self, pods: usize, waiting: f64, prompt: f64, generated: f64) -> bool {
        let valid = |x: f64| x.is_finite() && x >= 0.0;
        if pods == 0 || !valid(waiting) || !valid(prompt) || !valid(generated) {
            return false;
        }
        let n = pods as f64;
        // Strictly positive threshold: an idle service (nothing waiting) never counts.
        if waiting <= 0.0 || waiting < self.cfg.min_waiting_per_replica * n {
            return false;
        }
        if prompt + generated <= 0.0 {
            // Waiting yet producing nothing: a stalled engine, not a measure of capacity.
            return false;
        }
        if self.recent.len() == self.cfg.samples {
            self.recent.pop_front();
        }
        self.recent.push_back(Throughput {
            prompt: prompt / n,
            generated: generated / n,
        });
        true
    }

    /// Saturated samples held.
    pub fn samples(&self) -> usize {
        self.recent.len()
    }

    /// What one replica sustains: the configured quantile of the saturated samples of each
    /// rate; `None` before the first.
    pub fn per_replica(&self) -> Option<Throughput> {
        if self.recent.is_empty() {
            return None;
        }
        let q = |f: fn(&Throughput) -> f64| {
            let mut v: Vec<f64> = self.recent.iter().map(f).collect();
            v.sort_by(f64::total_cmp);
            let rank = ((self.cfg.quantile * v.len() as f64).ceil() as usize).clamp(1, v.len());
            v[rank - 1]
        };
        Some(Throughput {
            prompt: q(|t| t.prompt),
            generated: q(|t| t.generated),
        })
    }

    /// Per-replica targets for the two token rates at `utilization` of the learned capacity;
    /// `None` before the first saturated sample. A rate a saturated replica never produced
    /// (e.g. no prompt tokens counted) has no target.
    pub fn targets(&self, utilization: f64) -> Option<Throughput> {
        let c = self.per_replica()?;
        let u = if utilization.is_finite() && utilization > 0.0 {
            utilization
        } else {
            1.0
        };
        Some(Throughput {
            prompt: c.prompt * u,
            generated: c.generated * u,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learner() -> LearnedCapacity {
        LearnedCapacity::new(CapacityConfig::default())
    }

    #[test]
    fn nothing_is_learned_until_requests_queue() {
        let mut c = learner();
        assert!(!c.observe(2, 0.0, 5000.0, 800.0), "idle queue");
        assert!(
            !c.observe(4, 3.0, 5000.0, 800.0),
            "less than one waiting per pod"
        );
        assert_eq!(c.per_replica(), None);
        assert_eq!(c.targets(0.6), None);
        assert!(c.observe(2, 2.0, 5000.0, 800.0));
        let t = c.per_replica().expect("learned");
        assert_eq!(t.prompt, 2500.0);
        assert_eq!(t.generated, 400.0);
        let target = c.targets(0.5).expect("learned");
        assert_eq!(target.prompt, 1250.0);
        assert_eq!(target.generated, 200.0);
    }

    #[test]
    fn the_capacity_is_the_upper_quantile_of_saturated_samples() {
        let mut c = learner();
        // Partly saturated windows read low; the replica's real pace is 700 tokens/s.
        for i in 0..40 {
            let generated = if i % 4 == 0 { 300.0 } else { 700.0 };
            c.observe(1, 5.0, 3.0 * generated, generated);
        }
        let t = c.per_replica().expect("learned");
        assert_eq!(t.generated, 700.0);
        assert_eq!(t.prompt, 2100.0);
    }

    #[test]
    fn memory_is_fixed_and_the_estimate_follows_a_new_model() {
        let mut c = learner();
        for _ in 0..1000 {
            c.observe(2, 10.0, 4000.0, 1400.0);
        }
        assert_eq!(c.samples(), 64);
        for _ in 0..64 {
            c.observe(2, 10.0, 8000.0, 2800.0);
        }
        assert_eq!(c.per_replica().map(|t| t.generated), Some(1400.0));
    }

    #[test]
    fn garbage_and_stalls_are_ignored() {
        let mut c = learner();
        for (pods, waiting, p, g) in [
            (0, 5.0, 100.0, 100.0),
            (1, f64::NAN, 100.0, 100.0),
            (1, 5.0, -1.0, 100.0),
            (1, 5.0, 100.0, f64::INFINITY),
            (1, 5.0, 0.0, 0.0),
        ] {
            assert!(!c.observe(pods, waiting, p, g), "{pods} {waiting} {p} {g}");
        }
        assert_eq!(c.samples(), 0);
        let odd = LearnedCapacity::new(CapacityConfig {
            samples: 0,
            min_waiting_per_replica: f64::NAN,
            quantile: 7.0,
        });
        assert_eq!(odd.cfg.samples, 1);
        assert_eq!(odd.cfg.quantile, 1.0);
    }

    proptest::proptest! {
        #[test]
        fn targets_scale_with_utilization_and_stay_within_the_samples(
            readings in proptest::collection::vec((1usize..16, 0.0f64..100.0, 0.0f64..1e5, 0.0f64..1e4), 1..200),
            u in 0.05f64..1.0,
        ) {
            let mut c = learner();
            let mut kept = Vec::new();
            for (pods, waiting, p, g) in readings {
                if c.observe(pods, waiting, p, g) {
                    kept.push((p / pods as f64, g / pods as f64));
                }
            }
            match c.targets(u) {
                None => proptest::prop_assert!(kept.is_empty()),
                Some(t) => {
                    let cap = c.per_replica().expect("learned");
                    proptest::prop_assert!((t.prompt - cap.prompt * u).abs() <= 1e-9 * cap.prompt.max(1.0));
                    proptest::prop_assert!((t.generated - cap.generated * u).abs() <= 1e-9 * cap.generated.max(1.0));
                    let recent = &kept[kept.len().saturating_sub(64)..];
                    proptest::prop_assert!(recent.iter().any(|(p, _)| *p == cap.prompt));
                    proptest::prop_assert!(recent.iter().any(|(_, g)| *g == cap.generated));
                }
            }
        }
    }
}
