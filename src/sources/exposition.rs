//! Reads vLLM's Prometheus text exposition (one pod's `/metrics`) into per-model values.
//!
//! Owns vLLM's metric names and how they are combined within one pod: data-parallel engines
//! (label `engine`) are summed for counts and averaged for the KV-cache fraction, and renamed
//! metrics are read under both names (new name preferred, per engine). Parsing itself is done by
//! a text-format parser crate; this module only interprets.

use std::collections::BTreeMap;

use prom_text_format_parser::{Scrape, ValueType};

/// Requests waiting for capacity (gauge).
pub const WAITING: &str = "vllm:num_requests_waiting";
/// Requests being processed (gauge).
pub const RUNNING: &str = "vllm:num_requests_running";
/// KV-cache use as a 0–1 fraction (gauge), vLLM ≥ 0.9.2.
pub const KV_CACHE: &str = "vllm:kv_cache_usage_perc";
/// The same gauge before vLLM 0.9.2 (removed in 0.12).
pub const KV_CACHE_OLD: &str = "vllm:gpu_cache_usage_perc";
/// Generated tokens (counter, exposed with `_total`).
pub const GENERATION_TOKENS: &str = "vllm:generation_tokens_total";
/// Prompt tokens processed (counter, exposed with `_total`).
pub const PROMPT_TOKENS: &str = "vllm:prompt_tokens_total";

/// Label naming the served model.
pub const MODEL_LABEL: &str = "model_name";
/// Label naming the data-parallel engine inside one pod.
pub const ENGINE_LABEL: &str = "engine";

/// One pod's readings for one model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelReadings {
    /// Waiting requests, summed over engines.
    pub waiting: Option<f64>,
    /// Running requests, summed over engines.
    pub running: Option<f64>,
    /// KV-cache fraction, averaged over engines.
    pub kv_cache: Option<f64>,
    /// Generated tokens so far, summed over engines (a counter).
    pub generation_tokens_total: Option<f64>,
    /// Prompt tokens processed so far, summed over engines (a counter).
    pub prompt_tokens_total: Option<f64>,
}

/// One pod's readings, per model name.
pub type PodReadings = BTreeMap<String, ModelReadings>;

/// Why a `/metrics` body could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExpositionError {
    #[error("not Prometheus text format: {0}")]
    Parse(String),
    #[error("{metric} has an invalid value {value}")]
    BadValue { metric: String, value: f64 },
}

impl ExpositionError {
    /// The error without any text taken from the body (parser messages quote the offending
    /// line), for messages that leave the process.
    pub fn summary(&self) -> String {
        match self {
            ExpositionError::Parse(_) => "not Prometheus text format".into(),
            ExpositionError::BadValue { .. } => self.to_string(),
        }
    }
}

#[derive(Default)]
struct Acc {
    waiting: Option<f64>,
    running: Option<f64>,
    kv_new: BTreeMap<String, f64>,
    kv_old: BTreeMap<String, f64>,
    tokens: Option<f64>,
    prompt_tokens: Option<f64>,
}

fn add(slot: &mut Option<f64>, v: f64) {
    *slot = Some(slot.unwrap_or(0.0) + v);
}

/// Parses one pod's exposition. Only samples carrying every `(label, value)` in `matchers` are
/// used. A body with no vLLM series gives an empty map (the caller decides what that means).
pub fn parse(text: &str, matchers: &[(String, String)]) -> Result<PodReadings, ExpositionError> {
    let scrape = if text.trim().is_empty() {
        return Err(ExpositionError::Parse("empty body".into()));
    } else {
        Scrape::parse(text).map_err(|e| ExpositionError::Parse(format!("{e:?}")))?
    };
    let mut models: BTreeMap<String, Acc> = BTreeMap::new();
    for metric in &scrape.metrics {
        // OpenMetrics names a counter's family without `_total`; both forms are read.
        let name = match metric.name.as_str() {
            n if n == GENERATION_TOKENS.trim_end_matches("_total") => GENERATION_TOKENS,
            n if n == PROMPT_TOKENS.trim_end_matches("_total") => PROMPT_TOKENS,
            n => n,
        };
        let known = matches!(
            name,
            WAITING | RUNNING | KV_CACHE | KV_CACHE_OLD | GENERATION_TOKENS | PROMPT_TOKENS
        );
        if !known {
            continue;
        }
        for sample in &metric.samples {
            if sample.value.value_type != ValueType::Sample {
                continue;
            }
            let label = |k: &str| {
                sample
                    .labels
                    .iter()
                    .find(|l| l.key == k)
                    .map(|l| l.value.as_str())
            };
            if !matchers.iter().all(|(k, v)| label(k) == Some(v.as_str())) {
                continue;
            }
            let value: f64 = sample
                .value
                .value
                .parse()
                .map_err(|_| ExpositionError::Parse(format!("{name}: unreadable value")))?;
            if !value.is_finite() || value < 0.0 {
                return Err(ExpositionError::BadValue {
                    metric: name.to_string(),
                    value,
                });
            }
            let model = label(MODEL_LABEL).unwrap_or_default().to_string();
            let engine = label(ENGINE_LABEL).unwrap_or_default().to_string();
            let acc = models.entry(model).or_default();
            match name {
                WAITING => add(&mut acc.waiting, value),
                RUNNING => add(&mut acc.running, value),
                KV_CACHE => {
                    *acc.kv_new.entry(engine).or_default() += value;
                }
                KV_CACHE_OLD => {
                    *acc.kv_old.entry(engine).or_default() += value;
                }
                PROMPT_TOKENS => add(&mut acc.prompt_tokens, value),
                _ => add(&mut acc.tokens, value),
            }
        }
    }
    Ok(models
        .into_iter()
        .map(|(model, acc)| {
            // Per engine, the new name wins; engines that only expose the old name still count.
            let mut kv = acc.kv_old;
            kv.extend(acc.kv_new);
            let kv_cache = (!kv.is_empty()).then(|| kv.values().sum::<f64>() / kv.len() as f64);
            (
                model,
                ModelReadings {
                    waiting: acc.waiting,
                    running: acc.running,
                    kv_cache,
                    generation_tokens_total: acc.tokens,
                    prompt_tokens_total: acc.prompt_tokens,
                },
            )
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vLLM ≥ 0.9.2 exposition with two data-parallel engines, as Python's client writes it.
    const NEW_TWO_ENGINES: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama"} 3.0
vllm:num_requests_running{engine="1",model_name="llama"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="llama"} 5.0
vllm:num_requests_waiting{engine="1",model_name="llama"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="llama"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="llama"} 0.25
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="llama"} 1000.0
vllm:generation_tokens_total{engine="1",model_name="llama"} 500.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="llama"} 1.7e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="llama"} 7000.0
vllm:prompt_tokens_total{engine="1",model_name="llama"} 2000.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="llama"} 1.7e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="llama"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="llama"} 12.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="llama"} 12.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="llama"} 1.5
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
"#;

    /// vLLM < 0.9.2: the KV-cache gauge had its old name.
    const OLD_NAMES: &str = r#"# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="qwen"} 0.9
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="qwen"} 2.0
"#;

    #[test]
    fn engines_are_summed_for_counts_and_averaged_for_kv_cache() {
        let pod = parse(NEW_TWO_ENGINES, &[]).expect("parses");
        let llama = &pod["llama"];
        assert_eq!(llama.waiting, Some(6.0));
        assert_eq!(llama.running, Some(7.0));
        assert_eq!(llama.kv_cache, Some(0.375));
        assert_eq!(llama.generation_tokens_total, Some(1500.0));
        assert_eq!(llama.prompt_tokens_total, Some(9000.0));
    }

    #[test]
    fn token_counters_are_read_under_their_openmetrics_family_names_too() {
        // Counters exposed under their family names, without `_total`.
        let text = "# TYPE vllm:prompt_tokens counter\n\
                    vllm:prompt_tokens{model_name=\"m\"} 40.0\n\
                    # TYPE vllm:generation_tokens counter\n\
                    vllm:generation_tokens{model_name=\"m\"} 4.0\n";
        let m = &parse(text, &[]).expect("parses")["m"];
        assert_eq!(m.prompt_tokens_total, Some(40.0));
        assert_eq!(m.generation_tokens_total, Some(4.0));
        assert_eq!(m.waiting, None);
    }

    #[test]
    fn prompt_and_generated_counters_never_mix() {
        let text = "# TYPE vllm:prompt_tokens_total counter\n\
                    vllm:prompt_tokens_total{model_name=\"m\"} 12.0\n";
        let m = &parse(text, &[]).expect("parses")["m"];
        assert_eq!(m.prompt_tokens_total, Some(12.0));
        assert_eq!(m.generation_tokens_total, None);
    }

    #[test]
    fn old_kv_cache_name_is_read_when_the_new_one_is_absent() {
        let pod = parse(OLD_NAMES, &[]).expect("parses");
        assert_eq!(pod["qwen"].kv_cache, Some(0.9));
        assert_eq!(pod["qwen"].running, None);
    }

    #[test]
    fn new_kv_cache_name_wins_when_both_are_exposed() {
        let text = "# TYPE vllm:gpu_cache_usage_perc gauge\n\
                    vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.1\n\
                    # TYPE vllm:kv_cache_usage_perc gauge\n\
                    vllm:kv_cache_usage_perc{model_name=\"m\"} 0.6\n";
        assert_eq!(parse(text, &[]).expect("parses")["m"].kv_cache, Some(0.6));
    }

    #[test]
    fn matchers_filter_samples() {
        let m = [("engine".to_string(), "1".to_string())];
        let pod = parse(NEW_TWO_ENGINES, &m).expect("parses");
        assert_eq!(pod["llama"].waiting, Some(1.0));
    }

    #[test]
    fn garbage_is_an_error_not_an_empty_reading() {
        assert!(parse("<html>oops</html>", &[]).is_err());
        assert!(parse("", &[]).is_err());
        let nan = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} NaN\n";
        assert!(matches!(
            parse(nan, &[]),
            Err(ExpositionError::BadValue { .. })
        ));
    }

    #[test]
    fn a_body_without_vllm_series_is_empty() {
        let text = "# TYPE up gauge\nup 1\n";
        assert!(parse(text, &[]).expect("parses").is_empty());
    }
}
