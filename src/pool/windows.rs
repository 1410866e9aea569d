//! Lending windows: daily time ranges in a time zone during which research work may be given
//! spare GPUs (e.g. `20:00-08:00@Asia/Seoul`). Outside every window no node is marked spare.
//! With no window configured, lending is continuous.
//!
//! Pure: the caller passes the instant to check.

use std::{fmt, str::FromStr};

use jiff::{Timestamp, civil::Time, tz::TimeZone};

/// Errors in a lending-window specification.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WindowError {
    #[error(
        "lending window {0:?} must look like HH:MM-HH:MM@Area/City (e.g. 20:00-08:00@Asia/Seoul; HH:MM:SS also works)"
    )]
    Shape(String),
    #[error("lending window {spec:?}: {time:?} is not a time of day (HH:MM or HH:MM:SS)")]
    Time { spec: String, time: String },
    #[error(
        "lending window {spec:?}: unknown time zone {zone:?} (use an IANA name such as Asia/Seoul or UTC)"
    )]
    Zone { spec: String, zone: String },
}

/// One daily window. `start == end` means the whole day; `start > end` wraps past midnight.
#[derive(Clone, Debug)]
pub struct Window {
    spec: String,
    start: Time,
    end: Time,
    zone: TimeZone,
}

impl PartialEq for Window {
    fn eq(&self, other: &Self) -> bool {
        self.spec == other.spec
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.spec)
    }
}

/// `HH:MM`, or `HH:MM:SS` for windows that must open or close to the second (tests, drills).
fn parse_time(spec: &str, s: &str) -> Result<Time, WindowError> {
    let err = || WindowError::Time {
        spec: spec.to_string(),
        time: s.to_string(),
    };
    let mut parts = s.trim().split(':');
    let mut next = |required: bool| -> Result<i8, WindowError> {
        match parts.next() {
            Some(p) if p.len() == 2 => p.parse().map_err(|_| err()),
            None if !required => Ok(0),
            _ => Err(err()),
        }
    };
    let (h, m, sec) = (next(true)?, next(true)?, next(false)?);
    if parts.next().is_some() {
        return Err(err());
    }
    if h == 24 && m == 0 && sec == 0 {
        // `24:00` as an end means midnight.
        return Ok(Time::midnight());
    }
    Time::new(h, m, sec, 0).map_err(|_| err())
}

impl FromStr for Window {
    type Err = WindowError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let spec = spec.trim();
        let (range, zone) = match spec.split_once('@') {
            Some((r, z)) => (r, z.trim()),
            None => (spec, "UTC"),
        };
        let (start, end) = range
            .split_once('-')
            .ok_or_else(|| WindowError::Shape(spec.to_string()))?;
        let start = parse_time(spec, start)?;
        let end = parse_time(spec, end)?;
        let zone = TimeZone::get(zone).map_err(|_| WindowError::Zone {
            spec: spec.to_string(),
            zone: zone.to_string(),
        })?;
        Ok(Self {
            spec: spec.to_string(),
            start,
            end,
            zone,
        })
    }
}

impl Window {
    /// Whether `now` falls inside this window (start inclusive, end exclusive).
    pub fn contains(&self, now: Timestamp) -> bool {
        let t = now.to_zoned(self.zone.clone()).time();
        match self.start.cmp(&self.end) {
            std::cmp::Ordering::Equal => true,
            std::cmp::Ordering::Less => self.start <= t && t < self.end,
            std::cmp::Ordering::Greater => t >= self.start || t < self.end,
        }
    }

    /// The first instant after `now` at which this window opens (its start time of day, in its
    /// zone, today or tomorrow). A start time skipped by a daylight-saving jump moves forward by
    /// the jump, as clocks do (02:30 in a 02:00-03:00 gap opens at 03:30).
    pub fn next_start(&self, now: Timestamp) -> Option<Timestamp> {
        let today = now.to_zoned(self.zone.clone());
        let start_on = |day: jiff::civil::Date| {
            day.to_datetime(self.start)
                .to_zoned(self.zone.clone())
                .ok()
                .map(|z| z.timestamp())
        };
        let date = today.date();
        match start_on(date) {
            Some(t) if t > now => Some(t),
            _ => start_on(date.tomorrow().ok()?),
        }
    }

    /// The window's time zone, as configured (`UTC` when none was given).
    pub fn zone(&self) -> &TimeZone {
        &self.zone
    }
}

/// The configured windows; empty means lending is always open.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Windows(pub Vec<Window>);

impl FromStr for Windows {
    type Err = WindowError;

    /// Parses a comma-separated list; an empty string means continuous lending.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(str::parse)
            .collect::<Result<Vec<_>, _>>()
            .map(Windows)
    }
}

impl Windows {
    /// Whether lending is open at `now`.
    pub fn open(&self, now: Timestamp) -> bool {
        self.0.is_empty() || self.0.iter().any(|w| w.contains(now))
    }

    /// When lending next opens after `now` (the earliest window start), and that window; `None`
    /// when no window is configured (lending never closes).
    pub fn next_opening(&self, now: Timestamp) -> Option<(Timestamp, &Window)> {
        self.0
            .iter()
            .filter_map(|w| w.next_start(now).map(|t| (t, w)))
            .min_by_key(|(t, _)| *t)
    }
}

impl fmt::Display for Windows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("always");
        }
        let parts: Vec<String> = self.0.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn overnight_window_wraps_past_midnight_in_its_own_zone() {
        let w: Window = "20:00-08:00@Asia/Seoul".parse().expect("window");
        // Seoul is UTC+9 all year.
        assert!(w.contains(at("2026-03-02T11:00:00Z")), "20:00 KST opens");
        assert!(w.contains(at("2026-03-02T15:00:00Z")), "00:00 KST");
        assert!(w.contains(at("2026-03-02T22:59:00Z")), "07:59 KST");
        assert!(!w.contains(at("2026-03-02T23:00:00Z")), "08:00 KST closes");
        assert!(!w.contains(at("2026-03-02T03:00:00Z")), "12:00 KST");
        assert!(!w.contains(at("2026-03-02T10:59:59Z")), "19:59 KST");
    }

    #[test]
    fn daytime_window_is_start_inclusive_end_exclusive() {
        let w: Window = "09:30-17:00@UTC".parse().expect("window");
        assert!(!w.contains(at("2026-03-02T09:29:59Z")));
        assert!(w.contains(at("2026-03-02T09:30:00Z")));
        assert!(!w.contains(at("2026-03-02T17:00:00Z")));
    }

    #[test]
    fn window_follows_daylight_saving_time() {
        let w: Window = "20:00-08:00@Europe/Paris".parse().expect("window");
        // Winter: UTC+1, summer: UTC+2.
        assert!(w.contains(at("2026-01-15T19:00:00Z")));
        assert!(!w.contains(at("2026-07-15T17:30:00Z")));
        assert!(w.contains(at("2026-07-15T18:00:00Z")));
    }

    #[test]
    fn equal_bounds_and_24_00_cover_the_day() {
        let whole: Window = "00:00-00:00@UTC".parse().expect("window");
        assert!(whole.contains(at("2026-03-02T13:00:00Z")));
        let evening: Window = "18:00-24:00@UTC".parse().expect("window");
        assert!(evening.contains(at("2026-03-02T23:59:00Z")));
        assert!(!evening.contains(at("2026-03-02T00:00:00Z")));
    }

    #[test]
    fn seconds_may_be_given_for_windows_that_turn_to_the_second() {
        let w: Window = "09:30:15-09:30:45@UTC".parse().expect("window");
        assert!(!w.contains(at("2026-03-02T09:30:14Z")));
        assert!(w.contains(at("2026-03-02T09:30:15Z")));
        assert!(!w.contains(at("2026-03-02T09:30:45Z")));
        for bad in [
            "9:30-10:00@UTC",
            "09:30:1-10:00@UTC",
            "09:30:00:00-10:00@UTC",
            "09:30:60-10:00@UTC",
        ] {
            assert!(
                matches!(bad.parse::<Window>(), Err(WindowError::Time { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_next_opening_is_the_earliest_window_start_after_now() {
        let w: Windows = "20:00-08:00@Asia/Seoul, 12:00-13:00@UTC"
            .parse()
            .expect("windows");
        // 09:00 UTC: 20:00 KST (11:00 UTC) comes before 12:00 UTC.
        let (t, win) = w.next_opening(at("2026-03-02T09:00:00Z")).expect("opens");
        assert_eq!(t, at("2026-03-02T11:00:00Z"));
        assert_eq!(win.to_string(), "20:00-08:00@Asia/Seoul");
        // 11:30 UTC: Seoul's window opened today already; next is 12:00 UTC.
        let (t, _) = w.next_opening(at("2026-03-02T11:30:00Z")).expect("opens");
        assert_eq!(t, at("2026-03-02T12:00:00Z"));
        // 13:30 UTC: both started today; Seoul's opens again tomorrow first.
        let (t, _) = w.next_opening(at("2026-03-02T13:30:00Z")).expect("opens");
        assert_eq!(t, at("2026-03-03T11:00:00Z"));
        // Exactly at a start, the next one is a day later.
        let one: Windows = "12:00-13:00@UTC".parse().expect("windows");
        let (t, _) = one.next_opening(at("2026-03-02T12:00:00Z")).expect("opens");
        assert_eq!(t, at("2026-03-03T12:00:00Z"));
        assert!(
            Windows::default()
                .next_opening(at("2026-03-02T12:00:00Z"))
                .is_none()
        );
    }

    #[test]
    fn a_start_inside_a_daylight_saving_gap_opens_just_after_it() {
        // Paris skipped 02:00-03:00 on 2026-03-29: 02:30 becomes 03:30 CEST, 01:30 UTC.
        let w: Windows = "02:30-04:00@Europe/Paris".parse().expect("windows");
        let (t, _) = w.next_opening(at("2026-03-28T23:00:00Z")).expect("opens");
        assert_eq!(t, at("2026-03-29T01:30:00Z"));
    }

    #[test]
    fn no_window_means_continuous_lending() {
        let w: Windows = "".parse().expect("windows");
        assert!(w.open(at("2026-03-02T12:00:00Z")));
        assert_eq!(w.to_string(), "always");
    }

    #[test]
    fn several_windows_are_ored() {
        let w: Windows = "01:00-02:00@UTC, 12:00-13:00@UTC".parse().expect("windows");
        assert!(w.open(at("2026-03-02T01:30:00Z")));
        assert!(w.open(at("2026-03-02T12:30:00Z")));
        assert!(!w.open(at("2026-03-02T05:00:00Z")));
    }

    #[test]
    fn bad_windows_are_explained() {
        assert!(matches!(
            "20:00@UTC".parse::<Window>(),
            Err(WindowError::Shape(_))
        ));
        assert!(matches!(
            "25:00-08:00@UTC".parse::<Window>(),
            Err(WindowError::Time { .. })
        ));
        assert!(matches!(
            "20:00-08:00@Mars/Olympus".parse::<Window>(),
            Err(WindowError::Zone { .. })
        ));
        let msg = "8pm-8am@UTC"
            .parse::<Window>()
            .expect_err("bad")
            .to_string();
        assert!(msg.contains("HH:MM"), "{msg}");
    }
}
