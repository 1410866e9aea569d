//! Admission plumbing: turns the bytes of an `AdmissionReview` into the bytes of the answer,
//! calling the pure [`mutate`] in between, and counts what happened.
//!
//! Owns the decision between "HTTP 400" (there is no review to answer: the body is not an
//! `admission.k8s.io/v1` AdmissionReview with a request and a uid) and "an AdmissionResponse
//! that refuses" (the review is well formed but its object cannot be handled): the request
//! errors ([`ReviewError`]) are turned into answers here and nowhere else. Knows nothing of
//! sockets or TLS.

use std::{borrow::Cow, sync::Arc, time::Instant};

use kube::core::{
    DynamicObject,
    admission::{
        AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND,
        Operation,
    },
};
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder},
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use super::{
    cluster::ClusterView,
    mutate::{Classification, Denial, Mutation, MutationPolicy, mutate},
    pod_fields::AdmittedPod,
};

/// Why a request cannot be reviewed. Those with a uid are answered with an invalid-request
/// AdmissionResponse, the others with HTTP 400 (`into_answer`, the one place).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the body is not an AdmissionReview in JSON: {0}")]
    NotAReview(String),
    #[error(
        "expected apiVersion admission.k8s.io/v1, kind AdmissionReview; got apiVersion {api_version:?}, kind {kind:?} (set admissionReviewVersions: [v1])"
    )]
    WrongType { api_version: String, kind: String },
    #[error("the AdmissionReview has no request")]
    MissingRequest,
    #[error("the AdmissionReview request has no uid")]
    MissingUid,
    #[error(
        "nightshift only handles pods, got {kind}: check the rules of the webhook configuration"
    )]
    NotAPod { uid: String, kind: String },
    #[error("the request carries no pod object")]
    MissingObject { uid: String },
    #[error("the request names no namespace")]
    MissingNamespace { uid: String },
    #[error("the pod cannot be read: {reason}")]
    UnreadablePod { uid: String, reason: String },
    #[error("encoding the answer failed: {0}")]
    Encode(String),
}

/// What happened to one review, for metrics and logs.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// A research pod was changed.
    Mutated,
    /// Admitted unchanged (not research, excluded, or already marked).
    Skipped,
    /// A research pod was refused.
    Denied,
    /// The request could not be handled (HTTP 400 or an invalid-request response).
    Invalid,
}

impl Outcome {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mutated => "mutated",
            Self::Skipped => "skipped",
            Self::Denied => "denied",
            Self::Invalid => "invalid",
        }
    }
}

impl EncodeLabelValue for Outcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: Outcome,
}

/// The webhook's metrics.
#[derive(Clone)]
pub struct Metrics {
    admissions: Family<OutcomeLabels, Counter>,
    latency: Histogram,
    patch_operations: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            admissions: Family::default(),
            // 50 µs … ~0.8 s: the API server's timeout is a few seconds at most, and a healthy
            // review takes well under a millisecond, so the low buckets carry the detail.
            latency: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.000_05, 2.0, 15,
            )),
            patch_operations: Counter::default(),
        }
    }
}

impl Metrics {
    /// Registers the metrics (`webhook_admissions_total{outcome}`,
    /// `webhook_admission_duration_seconds`, `webhook_patch_operations_total`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "webhook_admissions",
            "Pod admission reviews answered, by outcome (mutated, skipped, denied, invalid)",
            self.admissions.clone(),
        );
        registry.register(
            "webhook_admission_duration_seconds",
            "Time to answer one admission review, from body received to answer encoded",
            self.latency.clone(),
        );
        registry.register(
            "webhook_patch_operations",
            "JSON Patch operations returned to the API server",
            self.patch_operations.clone(),
        );
    }

    fn count(&self, outcome: Outcome) {
        self.admissions
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// How many reviews ended with `outcome` (for tests).
    #[cfg(any(test, feature = "test-support"))]
    pub fn admissions(&self, outcome: Outcome) -> u64 {
        self.admissions
            .get_or_create(&OutcomeLabels { outcome })
            .get()
    }

    /// What the duration histogram holds so far (for tests and benchmarks), read from
    /// their text exposition, as a scrape would.
    #[cfg(any(test, feature = "test-support"))]
    pub fn timed(&self) -> Timed {
        let mut registry = Registry::default();
        self.register(&mut registry);
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
            return Timed::default();
        }
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Timed {
            reviews: value("webhook_admission_duration_seconds_count") as u64,
            seconds: value("webhook_admission_duration_seconds_sum"),
        }
    }
}

/// The count and sum of the duration histogram ([`Metrics::timed`]).
#[cfg(any(test, feature = "test-support"))]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Timed {
    /// Reviews timed, and their whole time in seconds, from body received to answer encoded.
    pub reviews: u64,
    pub seconds: f64,
}

/// The answer to one HTTP request on `/mutate`.
#[derive(Debug)]
pub enum Answer {
    /// 200 with this JSON body (an AdmissionReview carrying a response).
    Review(Vec<u8>),
    /// 400 with this plain-text message: there is no review to answer.
    BadRequest(String),
}

/// Everything a review needs: the policy, the cluster view and the metrics.
#[derive(Clone)]
pub struct Reviewer {
    pub policy: Arc<MutationPolicy>,
    pub cluster: Arc<dyn ClusterView>,
    pub metrics: Metrics,
}

impl Reviewer {
    /// Answers one review body. Never panics on any input.
    pub async fn review(&self, body: &[u8]) -> Answer {
        let received = Instant::now();
        let (answer, outcome) = match self.review_inner(body).await {
            Ok((response, outcome)) => match encode(response) {
                Ok(bytes) => (Answer::Review(bytes), outcome),
                Err(e) => (Answer::BadRequest(e.to_string()), Outcome::Invalid),
            },
            Err(e) => {
                tracing::warn!(error = %e, "admission request rejected");
                (e.into_answer(), Outcome::Invalid)
            }
        };
        self.metrics.count(outcome);
        self.metrics
            .latency
            .observe(received.elapsed().as_secs_f64());
        answer
    }

    async fn review_inner(&self, body: &[u8]) -> Result<(AdmissionResponse, Outcome), ReviewError> {
        let request = parse(body)?;
        let uid = request.uid;
        let response = allowed(uid.clone());

        // Only pod creations are marked; anything else the configuration sends is let through
        // unchanged (updates cannot change priority or affinity of a pod anyway).
        if request.operation != Operation::Create || request.sub_resource.is_some() {
            return Ok((response, Outcome::Skipped));
        }
        let Some(pod) = request.object.as_deref() else {
            return Err(ReviewError::MissingObject { uid });
        };
        let Some(namespace) = pod_namespace(request.namespace.as_deref(), pod) else {
            return Err(ReviewError::MissingNamespace { uid });
        };
        let labels = if self.policy.excluded_namespaces.contains(namespace) {
            Default::default()
        } else {
            match self.cluster.namespace_labels(namespace).await {
                Ok(labels) => labels.unwrap_or_default(),
                Err(e) => {
                    // Fail closed for this pod only: it may be a research pod.
                    tracing::warn!(error = %e, namespace, "namespace lookup failed");
                    let response = response.deny(format!(
                        "nightshift: cannot read namespace {namespace:?} to decide whether this \
                         is a research pod; retry shortly ({e})"
                    ));
                    return Ok((response, Outcome::Denied));
                }
            }
        };
        let name = pod
            .metadata
            .name
            .as_deref()
            .or(pod.metadata.generate_name.as_deref())
            .unwrap_or_default();
        let classes: &dyn super::mutate::PriorityClasses = self.cluster.as_ref();
        match mutate(pod, namespace, &labels, &self.policy, classes) {
            Ok(Mutation {
                selection,
                patch,
                warnings,
            }) => {
                let ops = patch.len();
                let outcome = if ops > 0 {
                    Outcome::Mutated
                } else {
                    Outcome::Skipped
                };
                // Per pod, at debug: a line per pod creation at the default `info` would be
                // thousands of lines a second at a busy API server, and writing one to the log
                // pipe costs a quarter to half of the review itself (docs/performance.md). The
                // outcome is counted in the metrics, the pod carries the lent label, and the API
                // server's audit log keeps each patch.
                match selection {
                    Classification::Research { gpu } => tracing::debug!(
                        namespace,
                        pod = name,
                        gpu,
                        operations = ops,
                        dry_run = request.dry_run,
                        "research pod marked"
                    ),
                    Classification::Skipped(reason) => {
                        tracing::debug!(namespace, pod = name, reason = reason.as_str(), "skipped")
                    }
                }
                let mut response = response;
                if ops > 0 {
                    self.metrics.patch_operations.inc_by(ops as u64);
                    // The patch's text as written by `mutate`; the answer's `patchType` follows
                    // from its presence (see `encode`).
                    response.patch = Some(patch.into_bytes());
                }
                if !warnings.is_empty() {
                    response.warnings = Some(warnings);
                }
                Ok((response, outcome))
            }
            Err(denial) => {
                tracing::warn!(namespace, pod = name, reason = %denial, "research pod denied");
                Ok((deny(response, &denial), Outcome::Denied))
            }
        }
    }
}

/// The namespace a reviewed pod is created in: the request's, else the object's own; `None`
/// when neither names one.
pub fn pod_namespace<'a>(
    request_namespace: Option<&'a str>,
    pod: &'a AdmittedPod,
) -> Option<&'a str> {
    request_namespace
        .or(pod.metadata.namespace.as_deref())
        .filter(|ns| !ns.is_empty())
}

/// The answer that admits the object unchanged, to the request `uid`.
fn allowed(uid: String) -> AdmissionResponse {
    // `kube` builds an allowing response only from its own request type; this is the same
    // response (the fields `encode` writes: uid, allowed, an empty status) from the uid alone.
    let mut response = AdmissionResponse::invalid("");
    response.uid = uid;
    response.allowed = true;
    response.result = Default::default();
    response
}

fn deny(response: AdmissionResponse, denial: &Denial) -> AdmissionResponse {
    let mut response = response.deny(denial);
    response.result.code = 403;
    response.result.reason = "Forbidden".into();
    response
}

/// A pod review as read: what the decision and the answer use of the request.
#[derive(Debug)]
pub struct PodReview {
    pub uid: String,
    pub operation: Operation,
    pub sub_resource: Option<String>,
    pub namespace: Option<String>,
    pub dry_run: bool,
    /// Boxed, as the fast path reads it: the review moves its request several times, and an
    /// unboxed pod (about 700 bytes of metadata and spec fields) is copied at each move.
    pub object: Option<Box<AdmittedPod>>,
}

impl From<AdmissionRequest<AdmittedPod>> for PodReview {
    fn from(request: AdmissionRequest<AdmittedPod>) -> Self {
        Self {
            uid: request.uid,
            operation: request.operation,
            sub_resource: request.sub_resource,
            namespace: request.namespace,
            dry_run: request.dry_run,
            object: request.object.map(Box::new),
        }
    }
}

/// The review as the fast path reads it: the fields checked and decided on, their strings
/// borrowed from the body where they hold no escape. `resource` and `userInfo` are required, as
/// `kube`'s `AdmissionRequest` requires them, but only checked to be JSON; the other fields of
/// the request (the request's own kind and resource, the old object, the options) are skipped.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn<'a> {
    #[serde(borrow)]
    api_version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    request: Option<RequestIn<'a>>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestIn<'a> {
    #[serde(borrow)]
    uid: Cow<'a, str>,
    #[serde(borrow)]
    kind: KindIn<'a>,
    #[serde(rename = "resource")]
    _resource: serde::de::IgnoredAny,
    #[serde(borrow, default)]
    sub_resource: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    namespace: Option<Cow<'a, str>>,
    operation: Operation,
    #[serde(rename = "userInfo")]
    _user_info: serde::de::IgnoredAny,
    // Boxed: serde moves each field's value up through every enclosing struct as it returns
    // (`RequestIn`, `Option`, `ReviewIn`, the `Result`s between), and the review moves the request
    // on; inline, the pod's 700-odd bytes were copied at each step, 11 KB of the 32.8 KB a review
    // copied.
    #[serde(default)]
    object: Option<Box<AdmittedPod>>,
    #[serde(default)]
    dry_run: bool,
}

#[derive(serde::Deserialize)]
struct KindIn<'a> {
    #[serde(borrow)]
    group: Cow<'a, str>,
    #[serde(borrow)]
    version: Cow<'a, str>,
    #[serde(borrow)]
    kind: Cow<'a, str>,
}

impl ReviewIn<'_> {
    /// The pod review in `body`, when the fast path answers it ([`Self::into_pod_review`]).
    fn read(body: &str) -> Option<PodReview> {
        sonic_rs::from_str::<ReviewIn<'_>>(body)
            .ok()
            .and_then(ReviewIn::into_pod_review)
    }

    /// The pod review, when this is one the fast path answers: one that passes the full
    /// parse's checks ([`check_types`], [`check_request`]). `None` sends the body to the full
    /// parse, which says what is wrong.
    fn into_pod_review(self) -> Option<PodReview> {
        check_types(&self.api_version, &self.kind).ok()?;
        let request = self.request?;
        let kind = &request.kind;
        check_request(&request.uid, &kind.group, &kind.version, &kind.kind).ok()?;
        Some(PodReview {
            uid: request.uid.into_owned(),
            operation: request.operation,
            sub_resource: request.sub_resource.map(Cow::into_owned),
            namespace: request.namespace.map(Cow::into_owned),
            dry_run: request.dry_run,
            object: request.object,
        })
    }
}

/// Parses a review. The fast path ([`ReviewIn`]) reads only the request's fields the review uses
/// and the fields of the pod that decisions use, straight into their typed form
/// ([`AdmittedPod`]); when that fails, the body is parsed with `kube`'s admission types, and if
/// that fails too, loosely, to tell the caller precisely what is wrong (and to echo the uid when
/// there is one).
///
/// The review and its pod are read with `sonic-rs`, which checks the whole text as strictly as
/// `serde_json` (what is only skipped included) in less time; the loose parse, for errors only,
/// with `serde_json`. The body is checked to be UTF-8 once, as a whole (JSON text is UTF-8, and
/// the API server sends nothing else), with SIMD (`simdutf8`), and parsed as text, so the parser
/// checks no string again.
///
/// Public so that the fuzz targets drive exactly the parser [`Reviewer::review`] uses.
pub fn parse(body: &[u8]) -> Result<PodReview, ReviewError> {
    let body =
        simdutf8::compat::from_utf8(body).map_err(|e| ReviewError::NotAReview(e.to_string()))?;
    if let Some(review) = ReviewIn::read(body) {
        return Ok(review);
    }
    let typed_error = match sonic_rs::from_str::<AdmissionReview<AdmittedPod>>(body) {
        Ok(review) => {
            check_types(&review.types.api_version, &review.types.kind)?;
            let request: AdmissionRequest<AdmittedPod> =
                review.try_into().map_err(|_| ReviewError::MissingRequest)?;
            check_kube_request(&request)?;
            return Ok(request.into());
        }
        Err(e) => e,
    };
    let loose: AdmissionReview<DynamicObject> =
        serde_json::from_str(body).map_err(|e| ReviewError::NotAReview(e.to_string()))?;
    check_types(&loose.types.api_version, &loose.types.kind)?;
    let request: AdmissionRequest<DynamicObject> =
        loose.try_into().map_err(|_| ReviewError::MissingRequest)?;
    check_kube_request(&request)?;
    Err(ReviewError::UnreadablePod {
        uid: request.uid,
        reason: first_line(&typed_error),
    })
}

/// What `sonic-rs` says is wrong, where: the first line of its message, without the excerpt of
/// the body it adds on the lines after (the API server shows the message to whoever created the
/// pod, on one line).
fn first_line(error: &sonic_rs::Error) -> String {
    let message = error.to_string();
    message.lines().next().unwrap_or_default().to_string()
}

/// An `admission.k8s.io/v1` `AdmissionReview`, or what it is instead.
fn check_types(api_version: &str, kind: &str) -> Result<(), ReviewError> {
    if api_version != META_API_VERSION_V1 || kind != META_KIND {
        return Err(ReviewError::WrongType {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
        });
    }
    Ok(())
}

/// A request with a uid, about a core/v1 Pod (`group`, `version`, `kind` of the request's
/// object), or what is wrong with it.
fn check_request(uid: &str, group: &str, version: &str, kind: &str) -> Result<(), ReviewError> {
    if uid.is_empty() {
        return Err(ReviewError::MissingUid);
    }
    if !(group.is_empty() && kind == "Pod") {
        return Err(ReviewError::NotAPod {
            uid: uid.to_string(),
            kind: if group.is_empty() {
                format!("{version}/{kind}")
            } else {
                format!("{group}/{version}/{kind}")
            },
        });
    }
    Ok(())
}

/// [`check_request`] of a request as `kube` reads it.
fn check_kube_request<K>(request: &AdmissionRequest<K>) -> Result<(), ReviewError>
where
    K: kube::core::Resource,
{
    let kind = &request.kind;
    check_request(&request.uid, &kind.group, &kind.version, &kind.kind)
}

/// The answer as the API server reads it: an `AdmissionReview` carrying the response, its
/// `patch` in base64 as Go encodes a `[]byte` (kube's own serialisation writes the patch as an
/// array of numbers, which Go also accepts, at three to four times the size and far more encoding
/// work). The keys and the constant values are written as they are; every other value by
/// `serde_json`, except the patch's base64, written straight into the answer: base64 never needs
/// a JSON escape, and checking each of its bytes for one cost more than the rest of the answer.
fn encode(response: AdmissionResponse) -> Result<Vec<u8>, ReviewError> {
    let encoded_patch = response
        .patch
        .as_deref()
        .map_or(0, |p| base64_simd::STANDARD.encoded_length(p.len()));
    let warnings: usize = response
        .warnings
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(String::len)
        .sum();
    // Sized once for the whole answer, where growing from a small buffer took five
    // reallocations, each copying what was written so far.
    let mut out = Vec::with_capacity(ANSWER_FRAME + warnings + encoded_patch);
    write_answer(&mut out, &response).map_err(|e| ReviewError::Encode(e.to_string()))?;
    Ok(out)
}

/// Writes `response` as the answer's JSON into `out` (see [`encode`]).
fn write_answer(out: &mut Vec<u8>, response: &AdmissionResponse) -> serde_json::Result<()> {
    out.extend_from_slice(b"{\"apiVersion\":");
    serde_json::to_writer(&mut *out, META_API_VERSION_V1)?;
    out.extend_from_slice(b",\"kind\":");
    serde_json::to_writer(&mut *out, META_KIND)?;
    out.extend_from_slice(b",\"response\":{\"uid\":");
    serde_json::to_writer(&mut *out, &response.uid)?;
    out.extend_from_slice(if response.allowed {
        b",\"allowed\":true"
    } else {
        b",\"allowed\":false"
    });
    out.extend_from_slice(b",\"status\":");
    serde_json::to_writer(&mut *out, &response.result)?;
    if let Some(patch) = &response.patch {
        out.extend_from_slice(b",\"patch\":\"");
        base64_simd::STANDARD.encode_append(patch, out);
        out.extend_from_slice(b"\",\"patchType\":\"JSONPatch\"");
    }
    if !response.audit_annotations.is_empty() {
        out.extend_from_slice(b",\"auditAnnotations\":");
        serde_json::to_writer(&mut *out, &response.audit_annotations)?;
    }
    if let Some(warnings) = &response.warnings {
        out.extend_from_slice(b",\"warnings\":");
        serde_json::to_writer(&mut *out, warnings)?;
    }
    out.extend_from_slice(b"}}");
    Ok(())
}

/// Room in an answer for all but its patch and warnings: the keys, the uid and the status
/// (about 250 bytes for an allowed review), and the quotes and commas around each warning.
const ANSWER_FRAME: usize = 512;

impl ReviewError {
    /// The one place where errors become answers: HTTP 400 when there is no uid to answer to,
    /// otherwise an invalid-request AdmissionResponse echoing the uid.
    fn into_answer(self) -> Answer {
        let uid = match &self {
            ReviewError::MissingObject { uid }
            | ReviewError::MissingNamespace { uid }
            | ReviewError::NotAPod { uid, .. }
            | ReviewError::UnreadablePod { uid, .. } => uid.clone(),
            _ => return Answer::BadRequest(format!("{self}\n")),
        };
        let mut response = AdmissionResponse::invalid(&self);
        response.uid = uid;
        response.result.code = 400;
        match encode(response) {
            Ok(bytes) => Answer::Review(bytes),
            Err(e) => Answer::BadRequest(format!("{e}\n")),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    fn review(request: Value) -> String {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
            .to_string()
    }

    fn request(extra: Value) -> Value {
        let mut request = json!({
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "namespace": "research",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": {"metadata": {"name": "p", "labels": {"a": "b"}},
                "spec": {"containers": [{"name": "main", "image": "x"}]}},
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        });
        if let (Some(r), Value::Object(extra)) = (request.as_object_mut(), extra) {
            r.extend(extra);
        }
        request
    }

    /// What `kube`'s admission types read from the same body, as the full parse does.
    fn through_kube(body: &str) -> Option<PodReview> {
        let review: AdmissionReview<AdmittedPod> = sonic_rs::from_str(body).ok()?;
        let request: AdmissionRequest<AdmittedPod> = review.try_into().ok()?;
        Some(request.into())
    }

    /// The fast path reads what `kube`'s types read, for the reviews it answers; it is taken for
    /// every well-formed pod review, escaped strings included.
    #[test]
    fn the_fast_path_reads_what_kube_reads() {
        let cases = [
            json!({}),
            json!({"operation": "UPDATE", "subResource": "status"}),
            json!({"namespace": null, "dryRun": true}),
            json!({"uid": "u\u{e9}\\\"d", "namespace": "r\u{e9}search"}),
            json!({"object": null}),
        ];
        for extra in cases {
            let body = review(request(extra.clone()));
            let fast =
                ReviewIn::read(&body).unwrap_or_else(|| panic!("fast path not taken: {extra}"));
            let full = through_kube(&body).expect("kube reads it");
            assert_eq!(format!("{fast:?}"), format!("{full:?}"), "{extra}");
            let parsed = parse(body.as_bytes()).expect("parses");
            assert_eq!(format!("{parsed:?}"), format!("{full:?}"), "{extra}");
        }
    }

    /// What the fast path does not answer goes to the full parse, and gets its errors.
    #[test]
    fn the_full_parse_explains_what_the_fast_path_leaves() {
        let mut deployment = request(json!({}));
        deployment["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
        let mut no_user = request(json!({}));
        no_user.as_object_mut().map(|r| r.remove("userInfo"));
        let cases = [
            (review(request(json!({"uid": ""}))), "no uid"),
            (review(deployment), "only handles pods"),
            (review(no_user), "not an AdmissionReview"),
            (
                review(request(json!({"object": {"spec": {"containers": 5}}}))),
                "cannot be read",
            ),
            (
                json!({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview",
                    "request": request(json!({}))})
                .to_string(),
                "admission.k8s.io/v1",
            ),
        ];
        for (body, expected) in cases {
            assert!(ReviewIn::read(&body).is_none(), "{body}");
            let error = parse(body.as_bytes()).expect_err("refused").to_string();
            assert!(error.contains(expected), "{expected}: {error}");
        }
    }

    /// The answer says what `kube`'s own serialisation of the response says, the patch in base64
    /// instead of an array of numbers: every field, for an answer with all of them (a patch,
    /// warnings, audit annotations, characters that need escaping) and for a refusal.
    #[test]
    fn the_answer_is_kubes_response_with_the_patch_in_base64() {
        use base64::Engine as _;

        let mut patched = allowed("uid-\"1\"".into());
        patched.patch = Some(br#"[{"op":"add","path":"/a","value":"\u00e9"}]"#.to_vec());
        patched.warnings = Some(vec!["tab\there".into(), "quote \" and \\".into()]);
        patched.audit_annotations = [("k".to_string(), "v\n".to_string())].into();
        let refused = deny(
            allowed("u2".into()),
            &Denial::MissingPriorityClass {
                class: "c\u{1}".into(),
            },
        );
        for response in [patched, refused] {
            let answer: Value = serde_json::from_slice(&encode(response.clone()).expect("encoded"))
                .expect("answer is JSON");
            let mut expected = serde_json::to_value(response.clone().into_review()).expect("kube");
            if let Some(bytes) = &response.patch {
                expected["response"]["patch"] =
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes));
                expected["response"]["patchType"] = json!("JSONPatch");
            }
            assert_eq!(answer, expected);
        }
    }
}
