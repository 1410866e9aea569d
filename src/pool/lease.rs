//! Leader election over a `coordination.k8s.io/v1` Lease, so that one replica writes node labels
//! while the others stand by and take over when the leader stops renewing.
//!
//! The decision ([`Elector::decide`]) is pure and judges expiry like client-go: by how long the
//! lease record has stayed unchanged on *our* clock, never by comparing the holder's timestamps
//! with ours (clocks drift). The transport ([`LeaseClient`]) reads the Lease and writes it with
//! the read `resourceVersion` as a precondition, so that of two replicas racing for an expired
//! lease only one wins (the other gets 409 Conflict and stands by).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

/// Errors while electing a leader.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("reading Lease {namespace}/{name} failed: {source}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("writing Lease {namespace}/{name} failed: {source}")]
    Write {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Timing of the election.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease record must stay unchanged before a standby takes it over.
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long stops acting as leader (shorter than
    /// `lease_duration`, so that it stops before anyone can take over).
    pub renew_deadline: Duration,
    /// How often the leader renews and standbys check.
    pub retry_period: Duration,
}

impl Timing {
    /// client-go's proven defaults scaled to `lease_duration`: renew deadline 2/3 of it,
    /// retry period 2/15 of it (15 s → 10 s, 2 s).
    pub fn from_lease_duration(lease_duration: Duration) -> Self {
        Self {
            lease_duration,
            renew_deadline: lease_duration * 2 / 3,
            retry_period: (lease_duration * 2 / 15).max(Duration::from_millis(100)),
        }
    }
}

/// What the Lease says, reduced to what the election compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub holder: Option<String>,
    pub renew_time: Option<Timestamp>,
    pub transitions: i32,
    /// `metadata.resourceVersion`: changes on every write, even when two renewals carry the
    /// same timestamp.
    pub version: Option<String>,
}

impl Record {
    pub fn from_lease(lease: &Lease) -> Self {
        let spec = lease.spec.as_ref();
        Self {
            version: lease.metadata.resource_version.clone(),
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
        }
    }
}

/// What to do after reading the Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No Lease exists: create it, holding it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it over.
    TakeOver,
    /// Someone else holds it and renews it: stand by.
    StandBy { holder: String },
}

/// The state of one candidate.
#[derive(Debug)]
pub struct Elector {
    pub identity: String,
    pub timing: Timing,
    observed: Option<(Record, Instant)>,
    last_renewed: Option<Instant>,
}

impl Elector {
    pub fn new(identity: impl Into<String>, timing: Timing) -> Self {
        Self {
            identity: identity.into(),
            timing,
            observed: None,
            last_renewed: None,
        }
    }

    /// Decides from the Lease read at `now` (`None`: it does not exist).
    pub fn decide(&mut self, current: Option<&Record>, now: Instant) -> Decision {
        let Some(record) = current else {
            return Decision::Create;
        };
        if record.holder.as_deref() == Some(self.identity.as_str()) {
            return Decision::Renew;
        }
        let Some(holder) = record.holder.clone() else {
            return Decision::TakeOver;
        };
        let since = match &self.observed {
            Some((seen, at)) if seen == record => *at,
            _ => {
                self.observed = Some((record.clone(), now));
                now
            }
        };
        if now.saturating_duration_since(since) >= self.timing.lease_duration {
            Decision::TakeOver
        } else {
            Decision::StandBy { holder }
        }
    }

    /// Records a successful write that made us the holder.
    pub fn renewed(&mut self, now: Instant) {
        self.last_renewed = Some(now);
        self.observed = None;
    }

    /// Records that someone else holds the lease (or that we lost a race).
    pub fn lost(&mut self) {
        self.last_renewed = None;
    }

    /// Whether we may act as leader at `now`: we renewed within the renew deadline.
    pub fn is_leader(&self, now: Instant) -> bool {
        self.last_renewed
            .is_some_and(|t| now.saturating_duration_since(t) < self.timing.renew_deadline)
    }

    /// The spec to write for `decision` (`previous`: the spec read, if any).
    pub fn next_spec(
        &self,
        decision: &Decision,
        previous: Option<&LeaseSpec>,
        now: Timestamp,
    ) -> LeaseSpec {
        let transitions = previous.and_then(|s| s.lease_transitions).unwrap_or(0);
        let (acquire_time, transitions) = match decision {
            Decision::Renew => (
                previous
                    .and_then(|s| s.acquire_time.clone())
                    .or(Some(MicroTime(now))),
                transitions,
            ),
            Decision::TakeOver => (Some(MicroTime(now)), transitions.saturating_add(1)),
            Decision::Create | Decision::StandBy { .. } => (Some(MicroTime(now)), transitions),
        };
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            // Whole seconds are what the field holds; round up so standbys never wait less.
            lease_duration_seconds: Some({
                let d = self.timing.lease_duration;
                i32::try_from(d.as_secs() + u64::from(d.subsec_nanos() > 0)).unwrap_or(i32::MAX)
            }),
            acquire_time,
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }
}

/// Reads and writes the Lease.
#[derive(Clone)]
pub struct LeaseClient {
    api: Api<Lease>,
    namespace: String,
    name: String,
}

impl LeaseClient {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    fn read_err(&self, source: kube::Error) -> LeaseError {
        LeaseError::Read {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    fn write_err(&self, source: kube::Error) -> LeaseError {
        LeaseError::Write {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    /// One election round: read, decide, write if needed. Returns whether we hold the lease.
    pub async fn round(&self, elector: &mut Elector) -> Result<bool, LeaseError> {
        self.round_at(elector, Instant::now()).await
    }

    /// [`LeaseClient::round`] with the local clock reading passed in (tests drive time).
    pub async fn round_at(&self, elector: &mut Elector, now: Instant) -> Result<bool, LeaseError> {
        let lease = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.read_err(e))?;
        let record = lease.as_ref().map(Record::from_lease);
        let decision = elector.decide(record.as_ref(), now);
        let spec = elector.next_spec(
            &decision,
            lease.as_ref().and_then(|l| l.spec.as_ref()),
            Timestamp::now(),
        );
        let written = match (&decision, lease) {
            (Decision::StandBy { holder }, _) => {
                tracing::debug!(%holder, "pool controller standing by");
                elector.lost();
                return Ok(false);
            }
            (Decision::Create, _) | (_, None) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (_, Some(mut lease)) => {
                // `metadata.resourceVersion` stays as read: the update is refused with 409 if
                // anyone wrote the Lease since.
                lease.spec = Some(spec);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match written {
            Ok(_) => {
                if decision == Decision::TakeOver || decision == Decision::Create {
                    tracing::info!(identity = %elector.identity, "acquired the pool controller lease");
                }
                elector.renewed(now);
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::debug!("lost a race for the pool controller lease");
                elector.lost();
                Ok(false)
            }
            Err(e) => Err(self.write_err(e)),
        }
    }

    /// Gives the lease up (on shutdown) so that a standby takes over at once.
    pub async fn release(&self, elector: &Elector) -> Result<(), LeaseError> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(|e| self.read_err(e))?
        else {
            return Ok(());
        };
        let ours = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(elector.identity.as_str());
        if !ours {
            return Ok(());
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = Some(MicroTime(Timestamp::now()));
        }
        self.api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
            .map_err(|e| self.write_err(e))?;
        tracing::info!("released the pool controller lease");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> Timing {
        Timing::from_lease_duration(Duration::from_secs(15))
    }

    fn held_by(holder: &str, renew_secs: i64) -> Record {
        Record {
            holder: Some(holder.to_string()),
            renew_time: Some(Timestamp::from_second(renew_secs).expect("ts")),
            transitions: 0,
            version: None,
        }
    }

    #[test]
    fn defaults_match_client_go() {
        let t = timing();
        assert_eq!(t.renew_deadline, Duration::from_secs(10));
        assert_eq!(t.retry_period, Duration::from_secs(2));
    }

    #[test]
    fn a_missing_lease_is_created() {
        let mut e = Elector::new("a", timing());
        assert_eq!(e.decide(None, Instant::now()), Decision::Create);
    }

    #[test]
    fn the_holder_renews() {
        let mut e = Elector::new("a", timing());
        assert_eq!(
            e.decide(Some(&held_by("a", 1)), Instant::now()),
            Decision::Renew
        );
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let mut e = Elector::new("b", timing());
        let free = Record {
            holder: None,
            renew_time: None,
            transitions: 3,
            version: None,
        };
        assert_eq!(e.decide(Some(&free), Instant::now()), Decision::TakeOver);
    }

    #[test]
    fn a_renewed_lease_keeps_standbys_waiting() {
        let mut e = Elector::new("b", timing());
        let t0 = Instant::now();
        assert!(matches!(
            e.decide(Some(&held_by("a", 1)), t0),
            Decision::StandBy { .. }
        ));
        // The leader renews every few seconds: the record changes, the clock restarts.
        for i in 1..20u64 {
            let d = e.decide(
                Some(&held_by("a", 1 + i as i64)),
                t0 + Duration::from_secs(5 * i),
            );
            assert_eq!(d, Decision::StandBy { holder: "a".into() });
        }
    }

    #[test]
    fn a_lease_unchanged_for_its_duration_is_taken_over() {
        let mut e = Elector::new("b", timing());
        let t0 = Instant::now();
        let stale = held_by("a", 1);
        assert!(matches!(
            e.decide(Some(&stale), t0),
            Decision::StandBy { .. }
        ));
        let d = e.decide(Some(&stale), t0 + Duration::from_secs(14));
        assert!(matches!(d, Decision::StandBy { .. }));
        assert_eq!(
            e.decide(Some(&stale), t0 + Duration::from_secs(15)),
            Decision::TakeOver
        );
    }

    #[test]
    fn expiry_ignores_the_holders_clock() {
        // A renew time far in the past (skewed clock) does not make a live lease look expired.
        let mut e = Elector::new("b", timing());
        let t0 = Instant::now();
        let d = e.decide(Some(&held_by("a", 0)), t0);
        assert!(matches!(d, Decision::StandBy { .. }));
    }

    #[test]
    fn a_leader_that_cannot_renew_steps_down_before_others_take_over() {
        let mut e = Elector::new("a", timing());
        let t0 = Instant::now();
        e.renewed(t0);
        assert!(e.is_leader(t0 + Duration::from_secs(9)));
        assert!(!e.is_leader(t0 + Duration::from_secs(10)));
        assert!(e.timing.renew_deadline < e.timing.lease_duration);
    }

    #[test]
    fn losing_a_race_ends_leadership() {
        let mut e = Elector::new("a", timing());
        let t0 = Instant::now();
        e.renewed(t0);
        e.lost();
        assert!(!e.is_leader(t0));
    }

    #[test]
    fn take_over_counts_a_transition_and_renew_keeps_acquire_time() {
        let e = Elector::new("b", timing());
        let acquired = Timestamp::from_second(100).expect("ts");
        let prev = LeaseSpec {
            holder_identity: Some("a".into()),
            acquire_time: Some(MicroTime(acquired)),
            lease_transitions: Some(4),
            ..LeaseSpec::default()
        };
        let now = Timestamp::from_second(200).expect("ts");
        let taken = e.next_spec(&Decision::TakeOver, Some(&prev), now);
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.lease_transitions, Some(5));
        assert_eq!(taken.acquire_time, Some(MicroTime(now)));
        assert_eq!(taken.lease_duration_seconds, Some(15));
        let renewed = e.next_spec(&Decision::Renew, Some(&prev), now);
        assert_eq!(renewed.lease_transitions, Some(4));
        assert_eq!(renewed.acquire_time, Some(MicroTime(acquired)));
        assert_eq!(renewed.renew_time, Some(MicroTime(now)));
    }

    /// An in-process stand-in for the API server's Lease endpoint, with the same
    /// `resourceVersion` precondition semantics (409 on a stale write).
    mod fake {
        use std::sync::{Arc, Mutex};

        use axum::http::{Method, Request, Response, StatusCode};
        use k8s_openapi::api::coordination::v1::Lease;

        #[derive(Default)]
        pub struct State {
            pub lease: Option<Lease>,
            pub version: u64,
            /// Simulates another writer between our read and our write, once.
            pub meddle_after_next_get: bool,
            pub writes: usize,
        }

        fn status(code: StatusCode, reason: &str) -> (StatusCode, String) {
            let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": reason, "reason": reason, "code": code.as_u16()});
            (code, body.to_string())
        }

        fn handle(state: &Mutex<State>, method: &Method, body: &[u8]) -> (StatusCode, String) {
            let mut s = state.lock().expect("fake state");
            match *method {
                Method::GET => match s.lease.clone() {
                    Some(l) => {
                        if std::mem::take(&mut s.meddle_after_next_get) {
                            s.version += 1;
                            let v = s.version.to_string();
                            if let Some(stored) = s.lease.as_mut() {
                                stored.metadata.resource_version = Some(v);
                            }
                        }
                        (StatusCode::OK, serde_json::to_string(&l).expect("json"))
                    }
                    None => status(StatusCode::NOT_FOUND, "NotFound"),
                },
                Method::POST if s.lease.is_some() => status(StatusCode::CONFLICT, "AlreadyExists"),
                Method::POST | Method::PUT => {
                    let mut l: Lease = serde_json::from_slice(body).expect("lease body");
                    if *method == Method::PUT {
                        let Some(stored) = s.lease.as_ref() else {
                            return status(StatusCode::NOT_FOUND, "NotFound");
                        };
                        if l.metadata.resource_version != stored.metadata.resource_version {
                            return status(StatusCode::CONFLICT, "Conflict");
                        }
                    }
                    s.version += 1;
                    s.writes += 1;
                    l.metadata.resource_version = Some(s.version.to_string());
                    s.lease = Some(l.clone());
                    (StatusCode::OK, serde_json::to_string(&l).expect("json"))
                }
                _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
            }
        }

        pub fn client(state: Arc<Mutex<State>>) -> kube::Client {
            let svc = tower::service_fn(move |req: Request<kube::client::Body>| {
                let state = state.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let bytes = body.collect_bytes().await.expect("request body");
                    let (code, json) = handle(&state, &parts.method, &bytes);
                    Ok::<_, std::convert::Infallible>(
                        Response::builder()
                            .status(code)
                            .header("content-type", "application/json")
                            .body(kube::client::Body::from(json.into_bytes()))
                            .expect("response"),
                    )
                }
            });
            kube::Client::new(svc, "nightshift-system")
        }
    }

    fn replica(
        state: &std::sync::Arc<std::sync::Mutex<fake::State>>,
        id: &str,
    ) -> (LeaseClient, Elector) {
        (
            LeaseClient::new(
                fake::client(state.clone()),
                "nightshift-system",
                "nightshift-pool",
            ),
            Elector::new(id, timing()),
        )
    }

    #[tokio::test]
    async fn one_replica_leads_and_a_standby_takes_over_when_it_dies() {
        let state = std::sync::Arc::default();
        let (ca, mut a) = replica(&state, "a");
        let (cb, mut b) = replica(&state, "b");
        let mut t = Instant::now();
        assert!(ca.round_at(&mut a, t).await.expect("round"), "a creates");
        assert!(!cb.round_at(&mut b, t).await.expect("round"), "b stands by");
        // a renews for a while; b keeps standing by.
        for _ in 0..10 {
            t += Duration::from_secs(2);
            assert!(ca.round_at(&mut a, t).await.expect("round"));
            assert!(!cb.round_at(&mut b, t).await.expect("round"));
        }
        // a dies: b takes over once the record has been silent for the lease duration.
        let mut waited = Duration::ZERO;
        while !cb.round_at(&mut b, t).await.expect("round") {
            t += Duration::from_secs(2);
            waited += Duration::from_secs(2);
            assert!(waited <= Duration::from_secs(20), "b never took over");
        }
        assert!(
            waited >= Duration::from_secs(14),
            "took over too early: {waited:?}"
        );
        let lease = state.lock().expect("state").lease.clone().expect("lease");
        let spec = lease.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
        // a comes back: it stands by.
        assert!(!ca.round_at(&mut a, t).await.expect("round"));
        assert!(!a.is_leader(t));
    }

    #[tokio::test]
    async fn a_write_after_someone_else_wrote_is_refused_and_leadership_not_taken() {
        let state = std::sync::Arc::<std::sync::Mutex<fake::State>>::default();
        let (ca, mut a) = replica(&state, "a");
        assert!(ca.round(&mut a).await.expect("round"));
        state.lock().expect("state").meddle_after_next_get = true;
        assert!(
            !ca.round(&mut a).await.expect("round"),
            "409 means not leader"
        );
        assert!(!a.is_leader(Instant::now()));
        // Next round reads the fresh version and renews.
        assert!(ca.round(&mut a).await.expect("round"));
    }

    #[tokio::test]
    async fn a_released_lease_is_taken_over_at_the_next_round() {
        let state = std::sync::Arc::default();
        let (ca, mut a) = replica(&state, "a");
        let (cb, mut b) = replica(&state, "b");
        assert!(ca.round(&mut a).await.expect("round"));
        assert!(!cb.round(&mut b).await.expect("round"));
        ca.release(&a).await.expect("release");
        assert!(cb.round(&mut b).await.expect("round"));
    }
}
