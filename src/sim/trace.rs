//! Reads request traces in the Azure LLM inference trace schema (`TIMESTAMP, ContextTokens,
//! GeneratedTokens`) and turns them into arrivals for a simulated run of any length.
//!
//! Owns parsing and the composition of days from one trace (time-warping the trace's arrival
//! process by a 24-hour envelope). It knows nothing about replicas or policies.

use std::path::{Path, PathBuf};

use jiff::civil::DateTime;

/// Why a trace could not be read. Every variant names the line so the file can be fixed.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read trace {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "line 1: expected the header `TIMESTAMP,ContextTokens,GeneratedTokens`, found {found:?}"
    )]
    Header { found: String },
    #[error("line {line}: {reason}")]
    Malformed { line: usize, reason: String },
    #[error("the trace has no requests")]
    Empty,
}

/// One request of the trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TraceRequest {
    /// Seconds since the trace's first request.
    pub offset: f64,
    /// Prompt tokens.
    pub context: u32,
    /// Output tokens.
    pub generated: u32,
}

/// A parsed trace, ordered by arrival.
#[derive(Clone, Debug)]
pub struct Trace {
    pub requests: Vec<TraceRequest>,
    /// Seconds from the first to the last request.
    pub span: f64,
}

impl Trace {
    /// Reads a trace file.
    pub fn read(path: &Path) -> Result<Trace, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
            path: path.to_owned(),
            source,
        })?;
        Trace::parse(&text)
    }

    /// Parses trace text (header line, then one request per line; blank lines are skipped).
    pub fn parse(text: &str) -> Result<Trace, TraceError> {
        let mut lines = text.lines().enumerate();
        let header = lines.next().map(|(_, l)| l).unwrap_or_default();
        let cols: Vec<&str> = header.split(',').map(str::trim).collect();
        if cols != ["TIMESTAMP", "ContextTokens", "GeneratedTokens"] {
            return Err(TraceError::Header {
                found: header.to_owned(),
            });
        }
        let mut raw: Vec<(DateTime, u32, u32)> = Vec::new();
        for (index, line) in lines {
            let line_no = index + 1;
            if line.trim().is_empty() {
                continue;
            }
            let malformed = |reason: String| TraceError::Malformed {
                line: line_no,
                reason,
            };
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            if fields.len() != 3 {
                return Err(malformed(format!(
                    "expected 3 comma-separated fields, found {}",
                    fields.len()
                )));
            }
            let at: DateTime = fields[0].parse().map_err(|e| {
                malformed(format!(
                    "TIMESTAMP {:?} is not a date-time like 2023-11-16 18:15:46.68: {e}",
                    fields[0]
                ))
            })?;
            let tokens = |name: &str, s: &str| {
                s.parse::<u32>()
                    .map_err(|_| malformed(format!("{name} {s:?} is not a whole number of tokens")))
            };
            let context = tokens("ContextTokens", fields[1])?;
            let generated = tokens("GeneratedTokens", fields[2])?;
            raw.push((at, context, generated));
        }
        if raw.is_empty() {
            return Err(TraceError::Empty);
        }
        // Public traces are ordered, but a merged file may not be: order by time, keep ties.
        raw.sort_by_key(|r| r.0);
        let first = raw[0].0;
        let requests: Vec<TraceRequest> = raw
            .into_iter()
            .map(|(at, context, generated)| TraceRequest {
                offset: at.duration_since(first).as_secs_f64(),
                context,
                generated,
            })
            .collect();
        let span = requests.last().map(|r| r.offset).unwrap_or_default();
        Ok(Trace { requests, span })
    }

    /// The same arrivals with every prompt and output length scaled (rounded, at least one
    /// token): another token mix with the trace's timing and burstiness.
    pub fn with_mix(&self, context: f64, generated: f64) -> Trace {
        let scale = |n: u32, m: f64| {
            let v = (f64::from(n) * m).round();
            if v >= f64::from(u32::MAX) {
                u32::MAX
            } else {
                (v as u32).max(1)
            }
        };
        Trace {
            requests: self
                .requests
                .iter()
                .map(|r| TraceRequest {
                    offset: r.offset,
                    context: scale(r.context, context),
                    generated: scale(r.generated, generated),
                })
                .collect(),
            span: self.span,
        }
    }

    /// Mean gap between consecutive requests, used when the replay wraps around.
    fn mean_gap(&self) -> f64 {
        if self.requests.len() > 1 && self.span > 0.0 {
            self.span / (self.requests.len() - 1) as f64
        } else {
            1.0
        }
    }
}

/// A 24-hour multiplier of the trace's arrival rate, linear between hourly points.
#[derive(Clone, Debug)]
pub struct Envelope {
    hourly: Vec<f64>,
    /// Day-of-week multipliers, day 0 of the run first.
    weekly: [f64; 7],
}

impl Envelope {
    /// `hourly[h]` is the multiplier at h:00; it must hold 24 positive finite values.
    pub fn new(hourly: &[f64]) -> Result<Envelope, String> {
        if hourly.len() != 24 {
            return Err(format!(
                "envelope.hourly needs 24 values (one per hour), got {}",
                hourly.len()
            ));
        }
        if let Some(bad) = hourly.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
            return Err(format!(
                "envelope.hourly values must be finite and above zero, got {bad}"
            ));
        }
        Ok(Envelope {
            hourly: hourly.to_vec(),
            weekly: [1.0; 7],
        })
    }

    /// The same envelope with a multiplier per day of the week (7 positive finite values).
    pub fn with_weekly(mut self, weekly: &[f64]) -> Result<Envelope, String> {
        let days: [f64; 7] = weekly.try_into().map_err(|_| {
            format!(
                "envelope.weekly needs 7 values (one per day), got {}",
                weekly.len()
            )
        })?;
        if let Some(bad) = days.iter().find(|v| !(v.is_finite() && **v > 0.0)) {
            return Err(format!(
                "envelope.weekly values must be finite and above zero, got {bad}"
            ));
        }
        self.weekly = days;
        Ok(self)
    }

    /// The multiplier at `t` seconds since midnight of day 0.
    pub fn at(&self, t: f64) -> f64 {
        let hours = t / 3600.0;
        self.hour_of(t, hours).at(hours)
    }

    /// The hour holding `t` (`hours` = `t` / 3600, which the caller has at hand).
    fn hour_of(&self, t: f64, hours: f64) -> Hour {
        // Whole hours and days as integers: a float remainder (`fmod`) and `floor` calls per
        // arrival were a few percent of a simulation.
        let whole = floor_i64(hours);
        let h = whole.rem_euclid(24) as usize;
        let a = self.hourly[h];
        let b = self.hourly[(h + 1) % 24];
        let day = floor_i64(t / 86_400.0).rem_euclid(7) as usize;
        Hour {
            start: whole as f64,
            base: a,
            slope: b - a,
            day: self.weekly[day],
        }
    }
}

/// One hour of an [`Envelope`]: the multiplier is linear within it, so a replay keeps the hour
/// it is in and looks the envelope up again only when it moves to the next.
#[derive(Clone, Copy, Debug)]
struct Hour {
    /// Whole hours since midnight of day 0 at its start.
    start: f64,
    base: f64,
    slope: f64,
    /// The day of the week's multiplier.
    day: f64,
}

impl Hour {
    /// Before any hour: holds no time.
    const NONE: Hour = Hour {
        start: f64::INFINITY,
        base: 0.0,
        slope: 0.0,
        day: 0.0,
    };

    fn holds(&self, hours: f64) -> bool {
        hours >= self.start && hours < self.start + 1.0
    }

    fn at(&self, hours: f64) -> f64 {
        (self.base + self.slope * (hours - self.start)) * self.day
    }
}

/// `x.floor()` as an integer, without a libm call (the baseline x86-64 target has no rounding
/// instruction); saturates far beyond any simulated time.
fn floor_i64(x: f64) -> i64 {
    let truncated = x as i64;
    if truncated as f64 > x {
        truncated - 1
    } else {
        truncated
    }
}

/// A simulated request: arrival time in seconds since midnight of day 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    pub at: f64,
    pub context: u32,
    pub generated: u32,
}

/// Endless arrivals: the trace replayed in a loop, its gaps divided by the envelope's multiplier
/// at the time of each arrival. The trace's burstiness and token mix are kept; only its rate
/// follows the envelope.
#[derive(Clone)]
pub struct Arrivals<'a> {
    trace: &'a Trace,
    envelope: &'a Envelope,
    index: usize,
    now: f64,
    wrap_gap: f64,
    /// The envelope's hour `now` is in.
    hour: Hour,
}

impl<'a> Arrivals<'a> {
    /// Starts the replay at the trace position chosen by `seed`.
    pub fn new(trace: &'a Trace, envelope: &'a Envelope, seed: u64) -> Arrivals<'a> {
        let index = (splitmix64(seed) % trace.requests.len() as u64) as usize;
        Arrivals {
            trace,
            envelope,
            index,
            now: 0.0,
            wrap_gap: trace.mean_gap(),
            hour: Hour::NONE,
        }
    }
}

impl Iterator for Arrivals<'_> {
    type Item = Arrival;

    fn next(&mut self) -> Option<Arrival> {
        let reqs = &self.trace.requests;
        let r = reqs[self.index];
        let arrival = Arrival {
            at: self.now,
            context: r.context,
            generated: r.generated,
        };
        let next = self.index + 1;
        let gap = if next < reqs.len() {
            reqs[next].offset - r.offset
        } else {
            self.wrap_gap
        };
        // Wraps without an integer division per arrival.
        self.index = if next < reqs.len() { next } else { 0 };
        let hours = self.now / 3600.0;
        if !self.hour.holds(hours) {
            self.hour = self.envelope.hour_of(self.now, hours);
        }
        self.now += gap / self.hour.at(hours);
        Some(arrival)
    }
}

/// A fixed, well-mixed hash (splitmix64) so that runs depend only on the seed.
pub fn splitmix64(seed: u64) -> u64 {
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n";

    #[test]
    fn parses_the_azure_schema_with_sub_second_timestamps() {
        let t = Trace::parse(&format!(
            "{HEADER}2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
        ))
        .expect("valid trace");
        assert_eq!(t.requests.len(), 2);
        assert_eq!(t.requests[0].context, 374);
        assert_eq!(t.requests[1].generated, 109);
        assert!((t.span - 4.314579).abs() < 1e-6, "span {}", t.span);
    }

    #[test]
    fn malformed_lines_name_their_line_number() {
        let cases = [
            ("2023-11-16 18:15:46.68,374\n", 2, "3 comma-separated"),
            (
                "2023-11-16 18:15:46.68,374,44\nyesterday,1,2\n",
                3,
                "TIMESTAMP",
            ),
            ("2023-11-16 18:15:46.68,many,44\n", 2, "ContextTokens"),
            ("2023-11-16 18:15:46.68,3,-4\n", 2, "GeneratedTokens"),
        ];
        for (body, line, needle) in cases {
            let err = Trace::parse(&format!("{HEADER}{body}")).expect_err("malformed");
            let msg = err.to_string();
            assert!(
                matches!(err, TraceError::Malformed { line: l, .. } if l == line),
                "{msg}"
            );
            assert!(msg.starts_with(&format!("line {line}: ")), "{msg}");
            assert!(msg.contains(needle), "{msg}");
        }
    }

    #[test]
    fn wrong_header_and_empty_traces_are_errors() {
        assert!(matches!(
            Trace::parse("time,in,out\n1,2,3\n"),
            Err(TraceError::Header { .. })
        ));
        assert!(matches!(Trace::parse(HEADER), Err(TraceError::Empty)));
        assert!(matches!(Trace::parse(""), Err(TraceError::Header { .. })));
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let err = Trace::read(Path::new("/nonexistent/trace.csv")).expect_err("missing");
        assert!(err.to_string().contains("/nonexistent/trace.csv"));
    }

    #[test]
    fn envelope_scales_the_arrival_rate() {
        // 11 requests one second apart, replayed at twice the rate: 0.5 s gaps.
        let mut body = String::from(HEADER);
        for s in 0..11 {
            body.push_str(&format!("2023-11-16 18:00:{s:02},10,5\n"));
        }
        let trace = Trace::parse(&body).expect("valid");
        let env = Envelope::new(&[2.0; 24]).expect("valid envelope");
        let times: Vec<f64> = Arrivals::new(&trace, &env, 0)
            .take(30)
            .map(|a| a.at)
            .collect();
        for w in times.windows(2) {
            assert!((w[1] - w[0] - 0.5).abs() < 1e-9, "{times:?}");
        }
    }

    #[test]
    fn a_replay_keeps_its_hour_yet_follows_the_envelope_exactly() {
        // Gaps of 60 s over a shape that changes every hour and every day: every arrival is
        // the previous one plus its gap over the envelope at that time, across hour and day
        // boundaries, bit for bit.
        let mut body = String::from(HEADER);
        for m in 0..60 {
            body.push_str(&format!("2023-11-16 18:{m:02}:00,10,5\n"));
        }
        let trace = Trace::parse(&body).expect("valid");
        let hourly: Vec<f64> = (0..24).map(|h| 0.5 + f64::from(h % 5)).collect();
        let env = Envelope::new(&hourly)
            .and_then(|e| e.with_weekly(&[1.0, 0.5, 2.0, 1.0, 1.0, 0.25, 3.0]))
            .expect("valid envelope");
        let times: Vec<f64> = Arrivals::new(&trace, &env, 0)
            .take_while(|a| a.at < 8.0 * 86_400.0)
            .map(|a| a.at)
            .collect();
        assert!(times.len() > 5_000, "{} arrivals", times.len());
        for w in times.windows(2) {
            assert_eq!(w[1], w[0] + 60.0 / env.at(w[0]), "after {}", w[0]);
        }
    }

    #[test]
    fn envelope_interpolates_between_hours_and_rejects_bad_values() {
        let mut hourly = [1.0; 24];
        hourly[1] = 3.0;
        let env = Envelope::new(&hourly).expect("valid");
        assert!((env.at(1800.0) - 2.0).abs() < 1e-12);
        assert!((env.at(86_400.0 + 3600.0) - 3.0).abs() < 1e-12);
        assert!(Envelope::new(&[1.0; 23]).is_err());
        let weekly = Envelope::new(&[2.0; 24])
            .and_then(|e| e.with_weekly(&[1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.25]))
            .expect("valid");
        assert_eq!(weekly.at(3600.0), 2.0);
        assert_eq!(weekly.at(5.0 * 86_400.0 + 3600.0), 1.0);
        assert_eq!(weekly.at(13.0 * 86_400.0), 0.5);
        assert!(
            Envelope::new(&[1.0; 24])
                .and_then(|e| e.with_weekly(&[1.0; 6]))
                .is_err()
        );
        assert!(
            Envelope::new(&[1.0; 24])
                .and_then(|e| e.with_weekly(&[0.0; 7]))
                .is_err()
        );
        hourly[5] = 0.0;
        assert!(Envelope::new(&hourly).is_err());
    }

    proptest::proptest! {
        #[test]
        fn integer_floor_is_floor(x in -1e12f64..1e12, whole in -1_000_000i64..1_000_000) {
            proptest::prop_assert_eq!(floor_i64(x) as f64, x.floor());
            proptest::prop_assert_eq!(floor_i64(whole as f64), whole);
        }
    }
}
