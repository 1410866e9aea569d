//! A short-lived cache that also coalesces concurrent fetches: while a fetch for a key is in
//! flight, or its outcome is younger than the TTL, every caller gets that same outcome. Errors
//! are cached too, so a source that is down is not hammered by every ScaledObject's poll.

use std::{
    collections::HashMap,
    future::Future,
    hash::Hash,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{
    FutureExt,
    future::{BoxFuture, Shared},
};

use super::SourceError;

type SharedFetch<V> = Shared<BoxFuture<'static, Result<Arc<V>, SourceError>>>;

struct Slot<V> {
    started: Instant,
    fetch: SharedFetch<V>,
}

impl<V> Slot<V> {
    /// Whether the fetch started less than `ttl` before `now`.
    fn fresh(&self, now: Instant, ttl: Duration) -> bool {
        now.duration_since(self.started) < ttl
    }

    /// Whether the slot answers at `now`: its fetch is in flight, or finished and fresh.
    fn answers(&self, now: Instant, ttl: Duration) -> bool {
        self.fetch.peek().is_none() || self.fresh(now, ttl)
    }
}

/// Coalescing TTL cache keyed by `K`.
pub struct Coalescer<K, V> {
    ttl: Duration,
    slots: Mutex<HashMap<K, Slot<V>>>,
}

/// Above this many keys, expired entries are pruned on insert. Keys are (upstream, query)
/// pairs, so this is only reached with many distinct configurations; pruning keeps memory
/// bounded without a background task.
const PRUNE_ABOVE: usize = 256;

impl<K, V> Coalescer<K, V>
where
    K: Eq + Hash + Clone,
    V: Send + Sync + 'static,
{
    /// A cache whose entries are fresh for `ttl` after their fetch started.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The outcome for `key` when its fetch has finished and is still fresh: what
    /// [`Coalescer::get_or_fetch`] would answer at once, here without a future to await;
    /// `None` when that would wait for a fetch or start one.
    pub fn fresh(&self, key: &K) -> Option<Result<Arc<V>, SourceError>> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = slots.get(key)?;
        if !slot.fresh(Instant::now(), self.ttl) {
            return None;
        }
        slot.fetch.peek().cloned()
    }

    /// Returns the fresh or in-flight outcome for `key`, or starts `fetch` and shares it.
    pub async fn get_or_fetch<F, Fut>(&self, key: &K, fetch: F) -> Result<Arc<V>, SourceError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V, SourceError>> + Send + 'static,
    {
        let shared = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            match slots.get(key) {
                Some(slot) if slot.answers(now, self.ttl) => slot.fetch.clone(),
                _ => {
                    if slots.len() > PRUNE_ABOVE {
                        let ttl = self.ttl;
                        slots.retain(|_, s| s.answers(now, ttl));
                    }
                    let fetch = fetch().map(|r| r.map(Arc::new)).boxed().shared();
                    slots.insert(
                        key.clone(),
                        Slot {
                            started: now,
                            fetch: fetch.clone(),
                        },
                    );
                    fetch
                }
            }
        };
        shared.await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_callers_share_one_fetch() {
        let cache = Arc::new(Coalescer::<&str, u32>::new(Duration::from_secs(60)));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (release, gate) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let cache = cache.clone();
            let fetches = fetches.clone();
            let mut gate = gate.clone();
            tasks.push(tokio::spawn(async move {
                cache
                    .get_or_fetch(&"k", move || async move {
                        fetches.fetch_add(1, Ordering::SeqCst);
                        let _ = gate.wait_for(|open| *open).await;
                        Ok(7)
                    })
                    .await
            }));
        }
        tokio::task::yield_now().await;
        release.send(true).expect("receivers alive");
        for t in tasks {
            assert_eq!(*t.await.expect("joined").expect("fetched"), 7);
        }
        assert_eq!(fetches.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn only_a_finished_fresh_outcome_is_answered_at_once() {
        let cache = Arc::new(Coalescer::<&str, u32>::new(Duration::from_secs(60)));
        assert!(cache.fresh(&"k").is_none(), "nothing fetched yet");
        let (release, mut gate) = tokio::sync::watch::channel(false);
        let fetching = cache.clone();
        let in_flight = tokio::spawn(async move {
            let fetched = fetching
                .get_or_fetch(&"k", || async move {
                    let _ = gate.wait_for(|open| *open).await;
                    Ok(7)
                })
                .await;
            *fetched.expect("fetched")
        });
        tokio::task::yield_now().await;
        assert!(cache.fresh(&"k").is_none(), "still in flight");
        release.send(true).expect("the fetch waits");
        assert_eq!(in_flight.await.expect("joined"), 7);
        assert_eq!(*cache.fresh(&"k").expect("finished").expect("ok"), 7);

        // A cached error is answered as the error it is, until it is no longer fresh.
        // Long enough that the look below comes within it even on a paused machine.
        let short = Coalescer::<&str, u32>::new(Duration::from_millis(500));
        let down = SourceError::Unavailable {
            upstream: "x".into(),
            detail: "down".into(),
        };
        let failed = down.clone();
        assert!(
            short
                .get_or_fetch(&"k", || async move { Err(failed) })
                .await
                .is_err()
        );
        match short.fresh(&"k") {
            Some(Err(e)) => assert_eq!(e, down),
            other => panic!("the cached error, not {other:?}"),
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while short.fresh(&"k").is_some() {
            assert!(Instant::now() < deadline, "the error stayed fresh");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn errors_are_cached_for_the_ttl_then_retried() {
        // Long enough that the second call below comes within it even on a paused machine.
        let cache = Coalescer::<&str, u32>::new(Duration::from_millis(500));
        let down = || async {
            Err(SourceError::Unavailable {
                upstream: "x".into(),
                detail: "down".into(),
            })
        };
        assert!(cache.get_or_fetch(&"k", down).await.is_err());
        // Within the TTL the cached error is returned, the new fetch is not run.
        assert!(cache.get_or_fetch(&"k", || async { Ok(1) }).await.is_err());
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(v) = cache.get_or_fetch(&"k", || async { Ok(1) }).await {
                assert_eq!(*v, 1);
                break;
            }
            assert!(Instant::now() < deadline, "entry never expired");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
