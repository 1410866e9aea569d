//! Human-friendly durations (`500ms`, `30s`, `2m`, `1h 30m`) for flags and trigger metadata.
//!
//! The ground floor of the crate: it imports nothing of nightshift, so every component may use it.

use std::time::Duration;

/// Parses a human-friendly duration such as `500ms`, `30s`, `2m` or `1h 30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let signed: jiff::SignedDuration = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a duration (try 500ms, 30s, 2m): {e}"))?;
    Duration::try_from(signed).map_err(|_| format!("{s:?} must not be negative"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_in_friendly_units() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-5s").is_err());
    }
}
