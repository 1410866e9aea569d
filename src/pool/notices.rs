//! The Events nightshift tells researchers: one per happening on the research pod itself
//! ([`PodNotice`]), and a digest of them on the pod's Job or Workflow ([`OwnerNotice`], decided
//! by [`Digests`]).
//!
//! Pure: the controller decides what to tell and when, [`super::run`] publishes through kube's
//! event recorder. A Job of hundreds of pods must not get hundreds of Events, so its pods'
//! Events are gathered per owner and reason: the first pods a few seconds after the first one
//! is told, then at most one Event per owner and reason every [`OWNER_EVERY`], whose note
//! counts the pods and names a few.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    accounting::DisruptionRecord,
    owner::Owner,
    pending,
    reclaim::{Action, Change},
    status::age,
};

/// A Kubernetes Event to publish on a research pod, decided by the controller and sent by
/// [`super::run`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodNotice {
    pub namespace: String,
    pub name: String,
    /// The pod's UID (`kubectl describe` matches events by it).
    pub uid: Option<String>,
    /// `Preempted` (by the scheduler), `Disrupted` (evicted, deleted by a controller), `Lent`
    /// (bound to spare GPUs) or why it waits ([`pending::Reason::event_reason`]).
    pub reason: &'static str,
    /// `Preempt`, `Disrupt`, `Bind` or `Wait`.
    pub action: &'static str,
    /// A warning (work was lost, or waiting cannot end by itself) rather than a normal event.
    pub warning: bool,
    /// The human sentence.
    pub note: String,
    /// The pod's Job or Workflow, told too (through [`Digests`]).
    pub owner: Option<Owner>,
    /// What the owner's Event says of this pod.
    pub detail: Detail,
}

/// What happened to one pod, in the words its owner's Event lists it with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Detail {
    /// Bound to `gpus` spare GPUs of `node`.
    Lent { node: String, gpus: u64 },
    /// Preempted by the scheduler (`preempted`) or otherwise disrupted on `node`, after running
    /// `ran_seconds` (`None`: before it started), losing about `lost_gpu_minutes`.
    Disrupted {
        preempted: bool,
        node: String,
        ran_seconds: Option<i64>,
        lost_gpu_minutes: u64,
        /// The inference service that took the GPUs, when known.
        service: Option<String>,
    },
    /// Waiting for spare GPUs; the note says why.
    Waiting,
    /// Warned that inference service `service` will need its GPUs soon.
    Noticed { service: String },
    /// A notice withdrawn: the demand fell back.
    Withdrawn,
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

impl PodNotice {
    /// The notice for a research pod just bound to `gpus` GPUs of pool node `node`.
    pub fn lent(pod: &super::accounting::PodFacts, node: &str, gpus: u64) -> Self {
        Self {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: (!pod.key.contains('/')).then(|| pod.key.clone()),
            reason: "Lent",
            action: "Bind",
            warning: false,
            note: format!(
                "Bound to {} of inference node {node}, lent while inference does not need \
                 them; the pod is preempted when it does",
                plural(gpus, "spare GPU", "spare GPUs")
            ),
            owner: pod.owner.clone(),
            detail: Detail::Lent {
                node: node.to_string(),
                gpus,
            },
        }
    }

    /// The notice for a research pod waiting for spare GPUs, saying why.
    pub fn waiting(pod: &super::accounting::PodFacts, why: &pending::Reason) -> Self {
        Self {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: (!pod.key.contains('/')).then(|| pod.key.clone()),
            reason: why.event_reason(),
            action: "Wait",
            warning: why.warning(),
            note: why.note(),
            owner: pod.owner.clone(),
            detail: Detail::Waiting,
        }
    }

    /// The Event of a reclaim notice given to a pod, or withdrawn.
    pub fn reclaim(change: &Change) -> Self {
        let pod = &change.pod;
        let (reason, warning, note, detail) = match &change.action {
            Action::Give { service, hook, .. } => {
                let hook = if hook.is_some() {
                    "; its checkpoint endpoint is being called"
                } else {
                    ""
                };
                (
                    crate::core::vocabulary::RECLAIM_NOTICE_EVENT_REASON,
                    true,
                    format!(
                        "Inference service {service} is about to need more replicas, and the \
                         scheduler is expected to preempt this pod for them: checkpoint now. The \
                         annotation nightshift.io/reclaim-notice and the pod condition \
                         nightshift.io/ReclaimNotice are set{hook}"
                    ),
                    Detail::Noticed {
                        service: service.clone(),
                    },
                )
            }
            Action::Withdraw => (
                "ReclaimNoticeWithdrawn",
                false,
                "Inference demand fell back before any reclaim: the reclaim notice is withdrawn \
                 and the pod keeps its GPUs"
                    .to_string(),
                Detail::Withdrawn,
            ),
        };
        Self {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            reason,
            action: "Notice",
            warning,
            note,
            owner: pod.owner.clone(),
            detail,
        }
    }

    /// The notice for a disrupted research pod: where, after how long, the work lost.
    pub fn disrupted(r: &DisruptionRecord) -> Self {
        let preempted = r.reason == "PreemptionByScheduler";
        let (reason, action, verb) = match (preempted, &r.service) {
            (true, Some(service)) => (
                "Preempted",
                "Preempt",
                format!("Preempted by the scheduler for inference service {service}"),
            ),
            (true, None) => (
                "Preempted",
                "Preempt",
                "Preempted by the scheduler for inference".to_string(),
            ),
            (false, _) => ("Disrupted", "Disrupt", "Disrupted".to_string()),
        };
        let node = r.node.as_deref().unwrap_or("no node");
        let ran = r.ran_seconds.map_or_else(
            || "before it started".to_string(),
            |s| format!("after running {}", age(s)),
        );
        let lost_gpu_minutes = r.lost_gpu_seconds.unwrap_or(0).div_ceil(60);
        let lost = if lost_gpu_minutes == 0 {
            "no work lost".to_string()
        } else {
            format!(
                "about {} of work lost since its last checkpoint or start",
                plural(lost_gpu_minutes, "GPU-minute", "GPU-minutes")
            )
        };
        Self {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
            reason,
            action,
            warning: true,
            note: format!(
                "{verb} ({}) on node {node} {ran}, holding {}; {lost}",
                r.reason,
                plural(r.gpus, "GPU", "GPUs")
            ),
            owner: r.owner.clone(),
            detail: Detail::Disrupted {
                preempted,
                node: node.to_string(),
                ran_seconds: r.ran_seconds,
                lost_gpu_minutes,
                service: r.service.clone().filter(|_| preempted),
            },
        }
    }
}

/// An Event to publish on the Job or Workflow of research pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerNotice {
    /// The owner's namespace (its pods').
    pub namespace: String,
    pub owner: Owner,
    /// The same reason, action and type as its pods' Events.
    pub reason: &'static str,
    pub action: &'static str,
    pub warning: bool,
    /// How many pods, which (a few), and what happened to them.
    pub note: String,
}

/// How long the first pod's Event waits for its siblings before the owner is told: a Job's pods
/// are bound, or preempted, within a second or two of each other (the scheduler places and
/// preempts a burst in one cycle), so one Event on the Job says "8 pods" rather than "1 pod"
/// followed by "7 pods" a while later.
pub const GATHER: i64 = 10;

/// Least time between two Events of one reason on one owner. Longer than the 6 minutes during
/// which kube's recorder continues an Event as a series: a series keeps its first note (an
/// `events.k8s.io/v1` note is immutable), and an owner's note counts pods, so each Event on an
/// owner must be a new one whose note is true. Per owner and reason that is at most six Events
/// an hour, however many pods it has.
pub const OWNER_EVERY: i64 = 10 * 60;

/// Pods named in an owner's note; the rest are counted. Five names say which pods to
/// `kubectl describe` without the note nearing the size limit.
pub const NAMED: usize = 5;

/// The size limit of an `events.k8s.io/v1` note, in bytes (the API server refuses longer).
pub const NOTE_MAX: usize = 1024;

/// Owners (and reasons) tracked at once. Only owners told something within the last
/// [`OWNER_EVERY`] are tracked; a thousand Jobs or Workflows is far more than a GPU pool runs
/// at once, and beyond it new owners are not told (their pods still are).
pub const MAX_OWNERS: usize = 1000;

/// What an owner's Event says, from the first of its pods' details.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Headline {
    Lent,
    Preempted,
    Disrupted,
    Waiting,
    Noticed,
    Withdrawn,
}

/// The pods of one owner told one reason since its last Event.
#[derive(Clone, Debug)]
struct Bucket {
    namespace: String,
    owner: Owner,
    action: &'static str,
    warning: bool,
    headline: Headline,
    /// Pods told since the owner's last Event (by name: a pod told twice counts once).
    pods: BTreeSet<String>,
    /// The first [`NAMED`] of them, with what happened.
    named: Vec<String>,
    lost_gpu_minutes: u64,
    /// The latest pod note (a waiting pod's reason in full).
    note: String,
    /// When the first of `pods` was told.
    first_at: i64,
    /// When the owner's last Event of this reason was decided.
    told_at: Option<i64>,
}

impl Bucket {
    fn due(&self, now: i64) -> bool {
        !self.pods.is_empty()
            && now - self.first_at >= GATHER
            && self.told_at.is_none_or(|t| now - t >= OWNER_EVERY)
    }

    fn note(&self) -> String {
        let n = self.pods.len() as u64;
        let pods = format!(
            "{} of this {}",
            plural(n, "pod", "pods"),
            self.owner.kind.kind()
        );
        let mut list = self.named.join(", ");
        let unnamed = self.pods.len().saturating_sub(self.named.len());
        if unnamed > 0 {
            list.push_str(&format!(" and {unnamed} more"));
        }
        let lost = match self.lost_gpu_minutes {
            0 => "no work lost".to_string(),
            m => format!(
                "about {} of work lost",
                plural(m, "GPU-minute", "GPU-minutes")
            ),
        };
        let note = match self.headline {
            Headline::Lent => format!(
                "{pods} bound to spare GPUs of inference nodes, lent while inference does not \
                 need them: {list}"
            ),
            Headline::Preempted => {
                format!("{pods} preempted by the scheduler for inference, {lost}: {list}")
            }
            Headline::Disrupted => format!(
                "{pods} disrupted (evicted, drained or stopped by the kubelet), {lost}: {list}"
            ),
            Headline::Waiting => format!("{pods}: {list}. {}", self.note),
            Headline::Noticed => format!(
                "{pods} warned that inference needs their GPUs soon (reclaim notice; the \
                 scheduler is expected to preempt them): {list}"
            ),
            Headline::Withdrawn => {
                format!("{pods} had their reclaim notice withdrawn (demand fell back): {list}")
            }
        };
        fit(note)
    }
}

/// Cuts `note` to [`NOTE_MAX`] bytes on a character boundary, marking the cut.
fn fit(mut note: String) -> String {
    if note.len() <= NOTE_MAX {
        return note;
    }
    const MARK: &str = "…";
    let mut end = NOTE_MAX - MARK.len();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    note.truncate(end);
    note.push_str(MARK);
    note
}

/// One pod, as its owner's note lists it.
fn brief(pod: &str, detail: &Detail) -> String {
    match detail {
        Detail::Lent { node, gpus } => {
            format!("{pod} ({} of {node})", plural(*gpus, "GPU", "GPUs"))
        }
        Detail::Disrupted {
            node,
            ran_seconds,
            lost_gpu_minutes,
            service,
            ..
        } => {
            let ran = ran_seconds.map_or_else(
                || "before it started".to_string(),
                |s| format!("after running {}", age(s)),
            );
            let ran = match service {
                Some(service) => format!("{ran}, for {service}"),
                None => ran,
            };
            match lost_gpu_minutes {
                0 => format!("{pod} on {node} {ran}"),
                m => format!(
                    "{pod} on {node} {ran}, {} lost",
                    plural(*m, "GPU-minute", "GPU-minutes")
                ),
            }
        }
        Detail::Waiting | Detail::Withdrawn => pod.to_string(),
        Detail::Noticed { service } => format!("{pod} (for {service})"),
    }
}

/// The owners' Events being gathered, per owner and reason, and when each was last told.
#[derive(Clone, Debug, Default)]
pub struct Digests {
    buckets: BTreeMap<(String, String, &'static str), Bucket>,
}

impl Digests {
    /// Adds a pod's notice at `now` (Unix seconds) to its owner's next Event. Returns `false`
    /// when the pod has no owner to tell, or [`MAX_OWNERS`] other owners are tracked.
    pub fn add(&mut self, n: &PodNotice, now: i64) -> bool {
        let Some(owner) = &n.owner else {
            return false;
        };
        let key = (n.namespace.clone(), owner.uid.clone(), n.reason);
        if !self.buckets.contains_key(&key) && self.buckets.len() >= MAX_OWNERS {
            return false;
        }
        let bucket = self.buckets.entry(key).or_insert_with(|| Bucket {
            namespace: n.namespace.clone(),
            owner: owner.clone(),
            action: n.action,
            warning: n.warning,
            headline: match n.detail {
                Detail::Lent { .. } => Headline::Lent,
                Detail::Disrupted {
                    preempted: true, ..
                } => Headline::Preempted,
                Detail::Disrupted { .. } => Headline::Disrupted,
                Detail::Waiting => Headline::Waiting,
                Detail::Noticed { .. } => Headline::Noticed,
                Detail::Withdrawn => Headline::Withdrawn,
            },
            pods: BTreeSet::new(),
            named: Vec::new(),
            lost_gpu_minutes: 0,
            note: String::new(),
            first_at: now,
            told_at: None,
        });
        if bucket.pods.is_empty() {
            bucket.first_at = now;
        }
        if bucket.pods.insert(n.name.clone()) {
            if bucket.named.len() < NAMED {
                bucket.named.push(brief(&n.name, &n.detail));
            }
            if let Detail::Disrupted {
                lost_gpu_minutes, ..
            } = n.detail
            {
                bucket.lost_gpu_minutes = bucket.lost_gpu_minutes.saturating_add(lost_gpu_minutes);
            }
        }
        bucket.note.clone_from(&n.note);
        true
    }

    /// The owners' Events due at `now`, each starting a new gathering; forgets owners with
    /// nothing to tell whose last Event is older than [`OWNER_EVERY`].
    pub fn due(&mut self, now: i64) -> Vec<OwnerNotice> {
        let mut out = Vec::new();
        for ((_, _, reason), b) in &mut self.buckets {
            if !b.due(now) {
                continue;
            }
            out.push(OwnerNotice {
                namespace: b.namespace.clone(),
                owner: b.owner.clone(),
                reason,
                action: b.action,
                warning: b.warning,
                note: b.note(),
            });
            b.pods.clear();
            b.named.clear();
            b.lost_gpu_minutes = 0;
            b.told_at = Some(now);
        }
        self.buckets
            .retain(|_, b| !b.pods.is_empty() || b.told_at.is_some_and(|t| now - t < OWNER_EVERY));
        out
    }

    /// Forgets everything (a replica that stops leading tells nothing more).
    pub fn clear(&mut self) {
        self.buckets.clear();
    }

    /// Owners and reasons tracked.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::owner::OwnerKind;
    use proptest::prelude::*;

    fn job(name: &str) -> Owner {
        Owner {
            kind: OwnerKind::Job,
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    fn notice(pod: &str, owner: Option<Owner>, detail: Detail) -> PodNotice {
        let (reason, action, warning) = match &detail {
            Detail::Lent { .. } => ("Lent", "Bind", false),
            Detail::Disrupted {
                preempted: true, ..
            } => ("Preempted", "Preempt", true),
            Detail::Disrupted { .. } => ("Disrupted", "Disrupt", true),
            Detail::Waiting => ("NoSpareGPUs", "Wait", false),
            Detail::Noticed { .. } => ("ReclaimNotice", "Notice", true),
            Detail::Withdrawn => ("ReclaimNoticeWithdrawn", "Notice", false),
        };
        PodNotice {
            namespace: "team-a".into(),
            name: pod.into(),
            uid: Some(format!("uid-{pod}")),
            reason,
            action,
            warning,
            note: format!("note of {pod}"),
            owner,
            detail,
        }
    }

    fn lent(pod: &str, owner: &Owner) -> PodNotice {
        notice(
            pod,
            Some(owner.clone()),
            Detail::Lent {
                node: "gpu-2".into(),
                gpus: 1,
            },
        )
    }

    fn preempted(pod: &str, owner: &Owner, lost: u64) -> PodNotice {
        notice(
            pod,
            Some(owner.clone()),
            Detail::Disrupted {
                preempted: true,
                node: "gpu-17".into(),
                ran_seconds: Some(8040),
                lost_gpu_minutes: lost,
                service: None,
            },
        )
    }

    #[test]
    fn a_preempted_pod_and_its_owner_are_told_the_service_that_took_the_gpus() {
        let record = |service: Option<&str>| DisruptionRecord {
            namespace: "research".into(),
            name: "sft-0".into(),
            node: Some("gpu-17".into()),
            reason: "PreemptionByScheduler".into(),
            ran_seconds: Some(600),
            gpus: 4,
            at: jiff::Timestamp::from_second(1_900_000_000).expect("ts"),
            lost_gpu_seconds: Some(240),
            uid: None,
            noticed: None,
            service: service.map(str::to_string),
            owner: Some(job("sft")),
        };
        let told = PodNotice::disrupted(&record(Some("inference/llama")));
        assert!(
            told.note
                .starts_with("Preempted by the scheduler for inference service inference/llama ("),
            "{}",
            told.note
        );
        assert!(brief("sft-0", &told.detail).contains("for inference/llama"));
        let unknown = PodNotice::disrupted(&record(None));
        assert!(
            unknown
                .note
                .starts_with("Preempted by the scheduler for inference (")
        );
        assert!(!brief("sft-0", &unknown.detail).contains("for "));
    }

    #[test]
    fn a_pod_without_owner_is_told_on_itself_only() {
        let mut d = Digests::default();
        assert!(!d.add(&notice("p", None, Detail::Waiting), 0));
        assert!(d.is_empty());
        assert!(d.due(GATHER).is_empty());
    }

    #[test]
    fn a_burst_of_pods_is_one_event_on_the_job_after_the_gathering() {
        let sft = job("sft");
        let mut d = Digests::default();
        d.add(&lent("sft-0", &sft), 100);
        assert!(d.due(100).is_empty(), "waits for the siblings");
        d.add(&lent("sft-1", &sft), 101);
        d.add(&lent("sft-1", &sft), 102);
        assert!(d.due(100 + GATHER - 1).is_empty());
        let told = d.due(100 + GATHER);
        assert_eq!(told.len(), 1);
        let n = &told[0];
        assert_eq!((n.reason, n.action, n.warning), ("Lent", "Bind", false));
        assert_eq!(n.owner, sft);
        assert_eq!(n.namespace, "team-a");
        assert_eq!(
            n.note,
            "2 pods of this Job bound to spare GPUs of inference nodes, lent while inference \
             does not need them: sft-0 (1 GPU of gpu-2), sft-1 (1 GPU of gpu-2)",
            "a pod told twice counts once"
        );
        assert!(d.due(100 + GATHER + 1).is_empty(), "told once");
    }

    #[test]
    fn preemptions_add_up_the_work_lost_and_name_a_few_pods() {
        let sft = job("sft");
        let mut d = Digests::default();
        for i in 0..8 {
            d.add(&preempted(&format!("sft-{i}"), &sft, 52), 0);
        }
        let told = d.due(GATHER);
        assert_eq!(told.len(), 1);
        assert_eq!((told[0].reason, told[0].warning), ("Preempted", true));
        assert_eq!(
            told[0].note,
            "8 pods of this Job preempted by the scheduler for inference, about 416 GPU-minutes \
             of work lost: sft-0 on gpu-17 after running 2h14m, 52 GPU-minutes lost, sft-1 on \
             gpu-17 after running 2h14m, 52 GPU-minutes lost, sft-2 on gpu-17 after running \
             2h14m, 52 GPU-minutes lost, sft-3 on gpu-17 after running 2h14m, 52 GPU-minutes \
             lost, sft-4 on gpu-17 after running 2h14m, 52 GPU-minutes lost and 3 more"
        );
    }

    #[test]
    fn one_gpu_minute_is_singular() {
        let sft = job("sft");
        let mut d = Digests::default();
        d.add(&preempted("sft-0", &sft, 1), 0);
        assert_eq!(
            d.due(GATHER)[0].note,
            "1 pod of this Job preempted by the scheduler for inference, about 1 GPU-minute of \
             work lost: sft-0 on gpu-17 after running 2h14m, 1 GPU-minute lost"
        );
    }

    #[test]
    fn waiting_pods_are_counted_with_the_latest_reason() {
        let wf = Owner {
            kind: OwnerKind::Workflow,
            name: "eval".into(),
            uid: "uid-eval".into(),
        };
        let mut d = Digests::default();
        d.add(&notice("eval-a", Some(wf.clone()), Detail::Waiting), 0);
        d.add(&notice("eval-b", Some(wf.clone()), Detail::Waiting), 3);
        let told = d.due(GATHER);
        assert_eq!(told[0].reason, "NoSpareGPUs");
        assert_eq!(
            told[0].note,
            "2 pods of this Workflow: eval-a, eval-b. note of eval-b"
        );
    }

    #[test]
    fn owners_and_reasons_are_told_apart() {
        let (a, b) = (job("a"), job("b"));
        let mut d = Digests::default();
        d.add(&lent("a-0", &a), 0);
        d.add(&preempted("a-1", &a, 0), 0);
        d.add(&lent("b-0", &b), 0);
        let told = d.due(GATHER);
        let mut seen: Vec<(&str, &str)> = told
            .iter()
            .map(|n| (n.owner.name.as_str(), n.reason))
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, [("a", "Lent"), ("a", "Preempted"), ("b", "Lent")]);
        let no_loss = told.iter().find(|n| n.reason == "Preempted").expect("one");
        assert!(
            no_loss
                .note
                .contains("for inference, no work lost: a-1 on gpu-17")
        );
    }

    #[test]
    fn more_pods_within_the_period_wait_for_the_next_event() {
        let sft = job("sft");
        let mut d = Digests::default();
        d.add(&lent("sft-0", &sft), 0);
        assert_eq!(d.due(GATHER).len(), 1);
        d.add(&lent("sft-1", &sft), 60);
        d.add(&lent("sft-2", &sft), 70);
        assert!(d.due(OWNER_EVERY + GATHER - 1).is_empty(), "rate-limited");
        let told = d.due(OWNER_EVERY + GATHER);
        assert_eq!(told.len(), 1);
        assert!(
            told[0].note.starts_with("2 pods of this Job") && told[0].note.contains("sft-2"),
            "{}",
            told[0].note
        );
    }

    #[test]
    fn a_quiet_owner_is_forgotten_and_told_at_once_again() {
        let sft = job("sft");
        let mut d = Digests::default();
        d.add(&lent("sft-0", &sft), 0);
        d.due(GATHER);
        assert_eq!(d.len(), 1, "remembered while it may not be told");
        d.due(GATHER + OWNER_EVERY);
        assert!(d.is_empty(), "forgotten after the period");
        d.add(&lent("sft-9", &sft), 2000);
        assert_eq!(d.due(2000 + GATHER).len(), 1);
        d.add(&lent("sft-10", &sft), 2100);
        d.clear();
        assert!(d.due(5000).is_empty(), "a standby tells nothing");
    }

    #[test]
    fn beyond_the_owner_limit_new_owners_are_not_tracked() {
        let mut d = Digests::default();
        for i in 0..MAX_OWNERS {
            assert!(d.add(&lent("p", &job(&format!("j{i}"))), 0));
        }
        assert!(!d.add(&lent("p", &job("one-more")), 0));
        assert!(d.add(&lent("q", &job("j0")), 0), "known owners still are");
        assert_eq!(d.len(), MAX_OWNERS);
    }

    #[test]
    fn a_long_note_is_cut_within_the_event_limit() {
        let sft = job("sft");
        let mut d = Digests::default();
        let long = "p".repeat(250);
        for i in 0..NAMED {
            d.add(&lent(&format!("{long}é{i}"), &sft), 0);
        }
        let note = &d.due(GATHER)[0].note;
        assert!(note.len() <= NOTE_MAX, "{}", note.len());
        assert!(note.ends_with('…'));
    }

    #[test]
    fn pod_notices_carry_their_owner_and_detail() {
        use crate::{pool::accounting::pod_facts, test_support::fixtures::pod};
        let p = pod("team-a", "sft-0")
            .research()
            .on("gpu-2")
            .gpus(2)
            .owned_by("batch/v1", "Job", "sft")
            .build();
        let facts = pod_facts(&p, &crate::core::vocabulary::Vocabulary::default());
        let n = PodNotice::lent(&facts, "gpu-2", 2);
        assert_eq!(n.owner.map(|o| o.name), Some("sft".to_string()));
        assert_eq!(
            n.detail,
            Detail::Lent {
                node: "gpu-2".into(),
                gpus: 2
            }
        );
        let inference = pod("inf", "llama")
            .owned_by("batch/v1", "Job", "batch-inference")
            .build();
        let facts = pod_facts(&inference, &crate::core::vocabulary::Vocabulary::default());
        assert_eq!(facts.owner, None, "only research pods' owners are kept");
    }

    proptest! {
        /// However many pods of one Job are told, at whatever times, the Job gets at most one
        /// Event per reason per period, each counting only pods told since the previous one.
        #[test]
        fn an_owner_gets_a_bounded_number_of_events(
            steps in proptest::collection::vec((0i64..40, 0usize..500, any::<bool>()), 1..300)
        ) {
            let sft = job("sft");
            let mut d = Digests::default();
            let mut now = 0;
            let mut told: BTreeMap<&'static str, Vec<i64>> = BTreeMap::new();
            let mut adds = 0;
            let mut counted: BTreeMap<&str, usize> = BTreeMap::new();
            let mut distinct: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
            type Told = BTreeMap<&'static str, Vec<i64>>;
            let mut tally = |events: Vec<OwnerNotice>, now: i64, told: &mut Told| {
                for e in events {
                    assert!(e.note.len() <= NOTE_MAX);
                    // The note starts with the number of pods it counts.
                    let pods: usize =
                        e.note.split(' ').next().and_then(|c| c.parse().ok()).unwrap_or(0);
                    *counted.entry(e.reason).or_default() += pods;
                    told.entry(e.reason).or_default().push(now);
                }
            };
            for (step, pod, lend) in steps {
                now += step;
                let name = format!("sft-{pod}");
                let n = if lend { lent(&name, &sft) } else { preempted(&name, &sft, 1) };
                prop_assert!(d.add(&n, now));
                adds += 1;
                distinct.entry(n.reason).or_default().insert(name);
                tally(d.due(now), now, &mut told);
            }
            let end = now + OWNER_EVERY + GATHER;
            tally(d.due(end), end, &mut told);
            for times in told.values() {
                for pair in times.windows(2) {
                    prop_assert!(pair[1] - pair[0] >= OWNER_EVERY, "{:?}", times);
                }
            }
            // Every pod told reaches its owner, and none is counted more often than it was told.
            let total: usize = counted.values().sum();
            prop_assert!(total <= adds, "{} counted of {} told", total, adds);
            for (reason, pods) in &distinct {
                prop_assert!(counted.get(reason).copied().unwrap_or(0) >= pods.len());
            }
        }
    }
}
