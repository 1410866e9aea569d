//! What the sources keep per upstream, forgotten once unused: an EndpointSlice watch per
//! Service, counter histories per scrape target. ScaledObjects come and go, and whatever one
//! named must not be kept, or watched, for the life of the process.

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
}

impl<K: Eq + Hash, V> IdleMap<K, V> {
    /// An empty map forgetting entries unused for longer than `idle`.
    pub fn new(idle: Duration) -> Self {
        Self {
            idle,
            entries: HashMap::new(),
        }
    }

    /// The entry for `key`, marked used at `now`, made by `make` when absent. Entries idle at
    /// `now` are dropped first.
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
        self.sweep(now);
        let entry = match self.entries.entry(key) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => entry.insert((make()?, now)),
        };
        entry.1 = now;
        Ok(&mut entry.0)
    }

    /// Whether `key` has an entry that is not idle at `now`.
    pub fn is_live(&self, key: &K, now: Instant) -> bool {
        self.entries
            .get(key)
            .is_some_and(|(_, used)| now.saturating_duration_since(*used) <= self.idle)
    }

    /// Drops the entries unused for longer than the idle time at `now`; how many.
    pub fn sweep(&mut self, now: Instant) -> usize {
        let before = self.entries.len();
        let idle = self.idle;
        self.entries
            .retain(|_, (_, used)| now.saturating_duration_since(*used) <= idle);
        before - self.entries.len()
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
        assert_eq!(
            map.sweep(t0 + MINUTE),
            0,
            "exactly the idle time is still in use"
        );
        assert_eq!(map.sweep(t0 + 2 * MINUTE), 1);
        assert!(map.is_empty());
        assert!(
            token.is_cancelled(),
            "the watch owned by the entry is stopped"
        );
    }
}
