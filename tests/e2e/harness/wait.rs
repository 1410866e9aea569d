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

/// Polls `url` with `http` until it answers a success status or `timeout` passes. `alive` runs
/// before each request, so that a server process that exited fails the wait with its own error
/// instead of a connection refusal.
pub async fn http_ok(
    what: &str,
    http: &reqwest::Client,
    url: &str,
    timeout: Duration,
    mut alive: impl FnMut() -> Result<()>,
) -> Result<()> {
    until(what, timeout, || {
        let running = alive();
        async move {
            running?;
            let resp = http.get(url).send().await?;
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            Ok(if status.is_success() {
                Check::Done(())
            } else {
                Check::Pending(format!("{status}: {}", body.trim()))
            })
        }
    })
    .await
}
