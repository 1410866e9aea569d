//! Counter rates computed from successive scrapes, the way Prometheus' `rate()` does: a value
//! lower than the previous one is a counter reset (the process restarted) and counts from zero.
//! Series that disappear (pods gone) are forgotten; new series need two samples before they
//! have a rate. Pure: time is passed in as seconds.

use std::collections::{HashMap, VecDeque};

/// The increase of a counter over time-ordered samples `(t, value)`, treating any decrease as
/// a reset to zero followed by growth to the new value.
pub fn counter_increase(samples: &[(f64, f64)]) -> f64 {
    samples
        .windows(2)
        .map(|w| {
            let (prev, cur) = (w[0].1, w[1].1);
            if cur >= prev { cur - prev } else { cur }
        })
        .sum()
}

/// Per-second rate over time-ordered samples; `None` with fewer than two samples or no elapsed
/// time.
pub fn counter_rate(samples: &[(f64, f64)]) -> Option<f64> {
    let (first, last) = (samples.first()?, samples.last()?);
    let elapsed = last.0 - first.0;
    if samples.len() < 2 || elapsed <= 0.0 {
        return None;
    }
    Some(counter_increase(samples) / elapsed)
}

/// Keeps a short history per counter series and answers rates.
#[derive(Debug, Clone)]
pub struct CounterRates<K> {
    window: f64,
    series: HashMap<K, VecDeque<(f64, f64)>>,
}

impl<K: Eq + std::hash::Hash + Clone> CounterRates<K> {
    /// Rates are computed over roughly the last `window_secs` seconds (at least the last two
    /// samples, however far apart).
    pub fn new(window_secs: f64) -> Self {
        Self {
            window: window_secs,
            series: HashMap::new(),
        }
    }

    /// Records one scrape: each series' value with the time (seconds) it was read. Each pod
    /// carries its own time, the moment its answer arrived, so a slow neighbour in the same
    /// pass does not skew its rate. Series absent from this scrape are forgotten: a pod that
    /// comes back later starts a new history.
    pub fn observe(&mut self, values: impl IntoIterator<Item = (K, f64, f64)>) {
        let mut next: HashMap<K, VecDeque<(f64, f64)>> = HashMap::new();
        for (key, now, value) in values {
            if !value.is_finite() || value < 0.0 {
                continue;
            }
            let mut history = self.series.remove(&key).unwrap_or_default();
            if history.back().is_some_and(|(t, _)| *t >= now) {
                history.pop_back();
            }
            history.push_back((now, value));
            while history.len() > 2 && history.front().is_some_and(|(t, _)| now - t > self.window) {
                history.pop_front();
            }
            next.insert(key, history);
        }
        self.series = next;
    }

    /// The rate of one series, if it has two samples.
    pub fn rate(&self, key: &K) -> Option<f64> {
        let history = self.series.get(key)?;
        let samples: Vec<(f64, f64)> = history.iter().copied().collect();
        counter_rate(&samples)
    }

    /// Number of tracked series.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// Whether no series are tracked.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increase_of_a_steady_counter_is_last_minus_first() {
        assert_eq!(
            counter_increase(&[(0.0, 10.0), (1.0, 15.0), (2.0, 30.0)]),
            20.0
        );
    }

    #[test]
    fn a_decrease_is_a_reset_that_counts_from_zero() {
        // 100 -> 120 (+20), restart -> 5 (+5), -> 25 (+20)
        let samples = [(0.0, 100.0), (1.0, 120.0), (2.0, 5.0), (3.0, 25.0)];
        assert_eq!(counter_increase(&samples), 45.0);
        assert_eq!(counter_rate(&samples), Some(15.0));
    }

    #[test]
    fn rate_needs_two_samples_and_elapsed_time() {
        assert_eq!(counter_rate(&[]), None);
        assert_eq!(counter_rate(&[(1.0, 5.0)]), None);
        assert_eq!(counter_rate(&[(1.0, 5.0), (1.0, 9.0)]), None);
    }

    #[test]
    fn tracker_forgets_pods_that_disappear_and_restarts_them_fresh() {
        let mut rates = CounterRates::new(30.0);
        rates.observe([("a", 0.0, 0.0), ("b", 0.0, 100.0)]);
        rates.observe([("a", 10.0, 50.0), ("b", 10.0, 200.0)]);
        assert_eq!(rates.rate(&"a"), Some(5.0));
        assert_eq!(rates.rate(&"b"), Some(10.0));
        // b is gone; c is new and has no rate yet.
        rates.observe([("a", 20.0, 100.0), ("c", 20.0, 7.0)]);
        assert_eq!(rates.rate(&"b"), None);
        assert_eq!(rates.rate(&"c"), None);
        assert_eq!(rates.len(), 2);
        // b comes back with a reset counter: a fresh history, not a negative rate.
        rates.observe([("a", 30.0, 150.0), ("b", 30.0, 3.0), ("c", 30.0, 27.0)]);
        assert_eq!(rates.rate(&"b"), None);
        assert_eq!(rates.rate(&"c"), Some(2.0));
    }

    #[test]
    fn tracker_keeps_a_window_but_always_two_samples() {
        let mut rates = CounterRates::new(10.0);
        for (t, v) in [(0.0, 0.0), (5.0, 50.0), (10.0, 100.0), (15.0, 300.0)] {
            rates.observe([("a", t, v)]);
        }
        // Window 10 s at t=15 keeps samples from t=5 on: (300-50)/10.
        assert_eq!(rates.rate(&"a"), Some(25.0));
        // Scrapes far apart still give a rate over the last interval.
        rates.observe([("a", 100.0, 1150.0)]);
        assert_eq!(rates.rate(&"a"), Some(10.0));
    }

    #[test]
    fn each_series_is_rated_on_its_own_read_times() {
        // Both counters grow 100/s; b's answers arrive 0.5 s after a's in the same passes.
        let mut rates = CounterRates::new(30.0);
        rates.observe([("a", 0.0, 0.0), ("b", 0.5, 50.0)]);
        rates.observe([("a", 1.0, 100.0), ("b", 2.5, 250.0)]);
        assert_eq!(rates.rate(&"a"), Some(100.0));
        assert_eq!(rates.rate(&"b"), Some(100.0));
    }

    #[test]
    fn tracker_handles_a_reset_inside_the_window() {
        let mut rates = CounterRates::new(60.0);
        rates.observe([("a", 0.0, 1000.0)]);
        rates.observe([("a", 10.0, 1100.0)]);
        rates.observe([("a", 20.0, 50.0)]);
        // +100 then reset to 50: 150 over 20 s.
        assert_eq!(rates.rate(&"a"), Some(7.5));
    }

    #[test]
    fn garbage_values_are_ignored() {
        let mut rates = CounterRates::new(60.0);
        rates.observe([("a", 0.0, f64::NAN), ("b", 0.0, -1.0)]);
        assert!(rates.is_empty());
    }
}
