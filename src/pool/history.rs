//! GPUs of the pool by use over the last week: an in-memory ring of one sample a minute, for the
//! charts of the researchers' view.
//!
//! Pure: [`History`] takes samples with their time and answers averaged series over a span. It
//! lives in memory only, so it starts empty after a restart (the view says so).

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// One sample a minute: finer than any chart shows (24 h at 5-minute points), coarse enough that
/// a week is a few hundred KiB.
pub const SAMPLE_SECONDS: i64 = 60;
/// A week of samples: the longest chart (7 days × 24 h × 60 min = 10,080).
pub const CAPACITY: usize = 7 * 24 * 60;
/// The ring's memory when full: [`CAPACITY`] × 24-byte samples = 241,920 bytes (about 236 KiB).
pub const MAX_BYTES: usize = CAPACITY * std::mem::size_of::<Sample>();

/// GPUs of the pool by use at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// Unix seconds.
    pub at: i64,
    /// Held by inference and other non-research pods.
    pub inference: u32,
    /// Held by research pods.
    pub research: u32,
    /// Free and lendable (not held back as headroom).
    pub free: u32,
    /// Free but held back for inference bursts (headroom nodes).
    pub headroom: u32,
}

impl Sample {
    pub fn total(&self) -> u32 {
        self.inference
            .saturating_add(self.research)
            .saturating_add(self.free)
            .saturating_add(self.headroom)
    }
}

/// The last week of samples, oldest first. The ring is allocated whole at the start, so its
/// memory is [`MAX_BYTES`] from the first sample on and never grows past it.
#[derive(Clone, Debug)]
pub struct History {
    samples: VecDeque<Sample>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    pub fn new() -> Self {
        Self {
            samples: VecDeque::with_capacity(CAPACITY),
        }
    }

    /// Adds samples older than the oldest kept (a history rebuilt after a restart, oldest
    /// first), up to [`CAPACITY`] in all; the newest of them are kept. Returns how many.
    pub fn backfill(&mut self, older: &[Sample]) -> usize {
        let first = self.first_at().unwrap_or(i64::MAX);
        let usable: Vec<&Sample> = older.iter().filter(|s| s.at < first).collect();
        let mut kept = 0;
        let mut next_at = first;
        for s in usable.into_iter().rev() {
            if self.samples.len() == CAPACITY {
                break;
            }
            // One sample a minute, as live sampling keeps them.
            if s.at > next_at.saturating_sub(SAMPLE_SECONDS) {
                continue;
            }
            self.samples.push_front(*s);
            next_at = s.at;
            kept += 1;
        }
        kept
    }

    /// Heap memory of the ring (its capacity).
    pub fn heap_bytes(&self) -> usize {
        self.samples.capacity() * std::mem::size_of::<Sample>()
    }

    /// Records `sample` unless one was taken less than [`SAMPLE_SECONDS`] before it (or the clock
    /// went back); drops the oldest beyond [`CAPACITY`]. Returns whether it was recorded.
    pub fn record(&mut self, sample: Sample) -> bool {
        if let Some(last) = self.samples.back()
            && sample.at < last.at.saturating_add(SAMPLE_SECONDS)
        {
            return false;
        }
        if self.samples.len() == CAPACITY {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
        true
    }

    pub fn len(&self) -> usize {
        self.samples.len()
    }

    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// Time of the oldest sample kept (Unix seconds).
    pub fn first_at(&self) -> Option<i64> {
        self.samples.front().map(|s| s.at)
    }

    /// Mean GPUs by use per `bucket` seconds over `[from, to)`, one point per bucket that holds
    /// samples, stamped with the bucket's start. Empty buckets (before the first sample, or
    /// while the controller was down) are left out.
    pub fn series(&self, from: i64, to: i64, bucket: i64) -> Vec<Sample> {
        let bucket = bucket.max(1);
        let start = self.samples.partition_point(|s| s.at < from);
        let mut out = Vec::new();
        let mut acc: Option<(i64, [u64; 4], u64)> = None;
        let flush = |acc: (i64, [u64; 4], u64), out: &mut Vec<Sample>| {
            let (at, sums, n) = acc;
            let mean = |v: u64| u32::try_from((v + n / 2) / n.max(1)).unwrap_or(u32::MAX);
            out.push(Sample {
                at,
                inference: mean(sums[0]),
                research: mean(sums[1]),
                free: mean(sums[2]),
                headroom: mean(sums[3]),
            });
        };
        for s in self.samples.range(start..).take_while(|s| s.at < to) {
            let b = from + (s.at - from) / bucket * bucket;
            let values = [s.inference, s.research, s.free, s.headroom].map(u64::from);
            match &mut acc {
                Some((at, sums, n)) if *at == b => {
                    for (sum, v) in sums.iter_mut().zip(values) {
                        *sum += v;
                    }
                    *n += 1;
                }
                _ => {
                    if let Some(done) = acc.take() {
                        flush(done, &mut out);
                    }
                    acc = Some((b, values, 1));
                }
            }
        }
        if let Some(done) = acc {
            flush(done, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(at: i64, research: u32) -> Sample {
        Sample {
            at,
            inference: 4,
            research,
            free: 8 - 4 - research,
            headroom: 0,
        }
    }

    #[test]
    fn one_sample_a_minute_is_kept() {
        let mut h = History::new();
        assert!(h.record(at(0, 1)));
        assert!(!h.record(at(59, 2)), "within the minute");
        assert!(!h.record(at(-60, 2)), "clock went back");
        assert!(h.record(at(60, 2)));
        assert_eq!(h.len(), 2);
        assert_eq!(h.first_at(), Some(0));
    }

    #[test]
    fn the_ring_holds_a_week_and_drops_the_oldest() {
        let mut h = History::new();
        for i in 0..(CAPACITY as i64 + 10) {
            h.record(at(i * SAMPLE_SECONDS, 1));
        }
        assert_eq!(h.len(), CAPACITY);
        assert_eq!(h.first_at(), Some(10 * SAMPLE_SECONDS));
        assert_eq!(std::mem::size_of::<Sample>(), 24);
        assert_eq!(MAX_BYTES, 241_920);
        assert_eq!(h.heap_bytes(), MAX_BYTES, "allocated once, never grown");
    }

    #[test]
    fn a_backfill_goes_before_the_live_samples_a_minute_apart_within_the_week() {
        let mut h = History::new();
        h.record(at(100 * 60, 3));
        let older: Vec<Sample> = (0..=100).map(|i| at(i * 60 - 30, 1)).collect();
        // The sample at 99.5 min is within a minute of the live one and is skipped.
        assert_eq!(h.backfill(&older), 100);
        assert_eq!(h.len(), 101);
        assert_eq!(h.first_at(), Some(-30));
        let long: Vec<Sample> = (0..(CAPACITY as i64 * 2)).map(|i| at(i * 60, 1)).collect();
        let mut fresh = History::new();
        assert_eq!(fresh.backfill(&long), CAPACITY);
        assert_eq!(
            fresh.first_at(),
            Some(CAPACITY as i64 * 60),
            "the newest week"
        );
        assert_eq!(fresh.heap_bytes(), MAX_BYTES);
    }

    #[test]
    fn series_average_per_bucket_and_skip_empty_ones() {
        let mut h = History::new();
        // Minutes 0..5 research 1 and 3 alternating, then a gap, then minute 20 with 4.
        for (i, r) in [1, 3, 1, 3, 1].into_iter().enumerate() {
            h.record(at(i as i64 * 60, r));
        }
        h.record(at(20 * 60, 4));
        let s = h.series(0, 30 * 60, 300);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].at, s[0].research, s[0].inference), (0, 2, 4));
        assert_eq!((s[1].at, s[1].research), (1200, 4));
        assert_eq!(s[1].total(), 8);
        assert!(h.series(30 * 60, 40 * 60, 300).is_empty());
        let within = h.series(60, 240, 60);
        assert_eq!(within.len(), 3, "only samples in [from, to)");
    }
}
