//! The inference services of a run: each one's scenario, trace and envelope, made once from the
//! scenario ([`Scenario::service_scenarios`]) and the traces read for it, and shared by every
//! policy's run, the honest ceiling and the hindsight search.

use super::{
    config::{MixConfig, Scenario},
    trace::{Envelope, Trace},
};

/// One inference service: its own scenario (seed, envelope, token mix and size; the pool, the
/// research and the policies' settings are the run's), its trace with its token mix applied,
/// and its envelope.
pub struct Service {
    /// Empty when the pool serves one service.
    pub name: String,
    pub sc: Scenario,
    pub trace: Trace,
    pub envelope: Envelope,
}

impl Service {
    /// The services of `scenario`, the `i`-th replaying `traces[i]` (one trace per service, in
    /// the order of [`Scenario::service_scenarios`]).
    pub fn all(scenario: &Scenario, traces: &[&Trace]) -> Result<Vec<Service>, String> {
        let scenarios = scenario.service_scenarios();
        if traces.len() != scenarios.len() {
            return Err(format!(
                "{} services and {} traces: each service needs its trace",
                scenarios.len(),
                traces.len()
            ));
        }
        scenarios
            .into_iter()
            .zip(traces)
            .map(|((name, sc), trace)| {
                let envelope = Envelope::new(&sc.envelope.hourly)
                    .and_then(|e| e.with_weekly(&sc.envelope.weekly))
                    .map_err(|e| match name.as_str() {
                        "" => e,
                        name => format!("services: {name:?}: {e}"),
                    })?;
                let trace = if sc.mix == MixConfig::default() {
                    (*trace).clone()
                } else {
                    trace.with_mix(sc.mix.context, sc.mix.generated)
                };
                Ok(Service {
                    name,
                    sc,
                    trace,
                    envelope,
                })
            })
            .collect()
    }
}
