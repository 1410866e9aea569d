//! Waiting on conditions with deadlines: poll a check until it yields a value, fail with what was
//! awaited and the last observation when the deadline passes. No fixed sleeps anywhere.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// Pause between two checks: short next to the waits themselves (seconds), long enough not to
/// load a 2-core machine with API calls.
const POLL: Duration = Duration::from_millis(250);

/// Outcome of one check.
pub enum Check<T> {
    Done(T),
    /// Not yet; the string says what was seen, for the timeout message.
    Pending(String),
}

/// Polls `check` until it returns [`Check::Done`] or `timeout` passes. Errors from the check are
/// treated as "not yet" (the API server may be briefly busy) but reported if the deadline passes.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Check<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(Check::Done(v)) => return Ok(v),
            Ok(Check::Pending(seen)) => seen,
            Err(e) => format!("error: {e:#}"),
        };
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}; last seen: {last}");
        }
        tokio::time::sleep(POLL).await;
    }
}
