//! What the sources keep per upstream, forgotten once unused: an EndpointSlice watch per
//! Service, counter histories per scrape target, an HTTP client per Prometheus server, the
//! scaler's latest decision per ScaledObject. ScaledObjects come and go, and whatever one named
//! must not be kept, or watched, for the life of the process.

use std::{
    collections::HashMap,
    hash::Hash,
    time::{Duration, Instant},
};

/// Unused this long, an entry is forgotten. KEDA polls each ScaledObject every 30 s by default,
/// so 20 polls have been missed: the ScaledObject is gone or names another upstream. One that
/// polls less often than this pays a fresh start per poll (a re-list of its Service's
/// EndpointSlices, a rate warm-up), nothing worse.
pub const IDLE: Duration = Duration::from_secs(600);

/// Entries keyed by `K`, each remembering when it was last used; entries unused for longer than
/// the idle time are dropped (with whatever they own) when the map is next used.
pub struct IdleMap<K, V> {
    idle: Duration,
    entries: HashMap<K, (V, Instant)>,
    /// When the entries were last looked through for idle ones.
    swept: Option<Instant>,
}

/// Entries are looked through for idle ones at most once per this fraction of the idle time, so
/// a use costs a lookup, not a pass over every entry; an idle entry lives at most this much
/// longer.
const SWEEPS_PER_IDLE: u32 = 8;

impl<K: Eq + Hash, V> IdleMap<K, V> {
    /// An empty map forgetting entries unused for longer than `idle`.
    pub fn new(idle: Duration) -> Self {
        Self {
            idle,
            entries: HashMap::new(),
            swept: None,
        }
    }

    /// The entry for `key`, marked used at `now`, made by `make` when absent. Entries idle at
    /// `now` are dropped first (see [`SWEEPS_PER_IDLE`]), with whatever they own.
    pub fn use_or_insert_with(&mut self, key: K, now: Instant, make: impl FnOnce() -> V) -> &mut V {
        match self.use_or_try_insert_with(key, now, || Ok::<V, std::convert::Infallible>(make())) {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }

    /// As [`IdleMap::use_or_insert_with`] with a `make` that may fail (nothing is kept then).
    pub fn use_or_try_insert_with<E>(
        &mut self,
        key: K,
        now: Instant,
        make: impl FnOnce() -> Result<V, E>,
    ) -> Result<&mut V, E> {
        drop(self.sweep_if_due(now));
        let entry = match self.entries.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => entry.insert((make()?, now)),
        };
        entry.1 = now;
        Ok(&mut entry.0)
    }

    /// Keeps `value` for `key`, used at `now` (replacing any earlier value); returns the entries
    /// dropped as idle at `now` (see [`SWEEPS_PER_IDLE`]).
    pub fn insert(&mut self, key: K, value: V, now: Instant) -> Vec<(K, V)> {
        let dropped = self.sweep_if_due(now);
        self.entries.insert(key, (value, now));
        dropped
    }

    /// The value for `key`, idle or not, without marking it used.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|(value, _)| value)
    }

    /// Every value kept, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.values().map(|(value, _)| value)
    }

    /// Whether `key` has an entry that is not idle at `now`.
    pub fn is_live(&self, key: &K, now: Instant) -> bool {
        self.entries
            .get(key)
            .is_some_and(|(_, used)| now.saturating_duration_since(*used) <= self.idle)
    }

    /// [`IdleMap::sweep`], when the last one is at least an eighth of the idle time ago.
    fn sweep_if_due(&mut self, now: Instant) -> Vec<(K, V)> {
        let due = self
            .swept
            .is_none_or(|last| now.saturating_duration_since(last) >= self.idle / SWEEPS_PER_IDLE);
        if due { self.sweep(now) } else { Vec::new() }
    }

    /// Removes the entries unused for longer than the idle time at `now` and returns them.
    pub fn sweep(&mut self, now: Instant) -> Vec<(K, V)> {
        self.swept = Some(now);
        let idle = self.idle;
        self.entries
            .extract_if(|_, (_, used)| now.saturating_duration_since(*used) > idle)
            .map(|(key, (value, _))| (key, value))
            .collect()
    }

    /// Number of entries kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn entries_in_use_are_kept_and_idle_ones_dropped_on_next_use() {
        let t0 = Instant::now();
        let mut map = IdleMap::new(10 * MINUTE);
        *map.use_or_insert_with("a", t0, || 0) += 1;
        *map.use_or_insert_with("b", t0, || 0) += 1;
        // "a" is used every 5 minutes, "b" never again.
        for i in 1..=4 {
            *map.use_or_insert_with("a", t0 + i * 5 * MINUTE, || 0) += 1;
        }
        assert_eq!(map.len(), 1, "b, unused for 20 minutes, is dropped");
        assert!(map.is_live(&"a", t0 + 20 * MINUTE));
        assert!(!map.is_live(&"b", t0 + 20 * MINUTE));
        // "a" kept its value through every use.
        assert_eq!(*map.use_or_insert_with("a", t0 + 21 * MINUTE, || 0), 5);
        // A dropped key starts afresh.
        assert_eq!(*map.use_or_insert_with("b", t0 + 21 * MINUTE, || 0), 0);
    }

    #[test]
    fn dropping_an_entry_drops_what_it_owns() {
        let t0 = Instant::now();
        let token = tokio_util::sync::CancellationToken::new();
        let mut map = IdleMap::new(MINUTE);
        map.use_or_insert_with("watch", t0, || token.clone().drop_guard());
        assert!(!token.is_cancelled());
        assert!(
            map.sweep(t0 + MINUTE).is_empty(),
            "exactly the idle time is still in use"
        );
        let dropped = map.sweep(t0 + 2 * MINUTE);
        assert_eq!(dropped.len(), 1);
        assert!(map.is_empty());
        assert!(!token.is_cancelled(), "the caller holds what was swept");
        drop(dropped);
        assert!(
            token.is_cancelled(),
            "the watch owned by the entry is stopped"
        );
    }

    #[test]
    fn insert_replaces_and_returns_what_went_idle() {
        let t0 = Instant::now();
        let mut map = IdleMap::new(MINUTE);
        assert!(map.insert("a", 1, t0).is_empty());
        assert!(map.insert("b", 1, t0 + MINUTE).is_empty());
        assert!(map.insert("b", 2, t0 + MINUTE).is_empty());
        assert_eq!(map.insert("c", 1, t0 + 2 * MINUTE), vec![("a", 1)]);
        assert_eq!(map.get(&"b"), Some(&2));
        let mut values: Vec<i32> = map.values().copied().collect();
        values.sort_unstable();
        assert_eq!(values, vec![1, 2]);
    }
}
