//! Reviews taken in turn: when reviews come close together, the connections hand their bodies
//! to one task, which reviews those waiting back to back and hands each answer back to its
//! connection.
//!
//! Why: under load, a server core that alternates one review with one request's transport (TLS
//! records, HTTP framing, the kernel's TCP) runs each with the other's code and data in its
//! caches. Taken in turn, the reviews of all the connections with a request ready run one after
//! the other, with their own; on the 2-core machine of docs/performance.md ("Admission
//! webhook") the saturated rate went from 41-45 % to 54-57 % of the transport floor's.
//!
//! How a batch forms: the task, woken by a first body, reviews it at once, then yields to the
//! runtime, which runs the other connections that have a request ready (each hands its body
//! over) before it comes back; it then reviews everything waiting, and yields again, until a
//! pass brings nothing. A review received more than [`TAKE_TURNS_WITHIN`] after the last
//! answer is answered on its connection's own task: at a moderate rate there is no batch to
//! form.
//!
//! A review waits on nothing but the namespace lookup, which the watched cache answers at once.
//! A review whose lookup has to ask the API server (a namespace newer than the cache) is not
//! waited for: it goes on as a task of its own, and the reviews after it are not held up. The
//! queue is unbounded: what it holds is bounded by the connections and streams the server
//! accepts ([`super::server::Limits`]), each of which holds its body anyway. If the task is gone
//! (it never ends while the server runs), a connection reviews on its own task.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    task::Poll,
    time::{Duration, Instant},
};

use axum::body::Bytes;
use tokio::sync::{mpsc, oneshot};

use super::review::{Answer, Reviewer};

/// A review handed over: its body, when it was received (the latency metric counts the wait),
/// and where its answer goes.
struct Job {
    body: Bytes,
    received: Instant,
    reply: oneshot::Sender<Answer>,
}

/// The reviewer and the queue to its task, started by the first review (on the server's
/// runtime) and ended when the queue is dropped with the router.
pub struct ReviewQueue {
    reviewer: Arc<Reviewer>,
    jobs: OnceLock<Option<mpsc::UnboundedSender<Job>>>,
    /// When the last review was answered, in ns since `epoch` (0: none yet).
    last_answer: AtomicU64,
    epoch: Instant,
    /// [`TAKE_TURNS_WITHIN`], but for tests.
    within: Duration,
}

/// Reviews received less than this after the last answer are taken in turn; later, each is
/// answered on its connection's task. A saturated server answers a request every 25-70 µs
/// (the transport's floor plus a review, docs/performance.md), while at 2,000 reviews/s they
/// come 500 µs apart: there, no other connection has a request ready to join a batch, and the
/// hand-over would only add its own latency (about 50 µs at the median on the machine measured).
const TAKE_TURNS_WITHIN: Duration = Duration::from_micros(100);

impl ReviewQueue {
    pub fn new(reviewer: Reviewer) -> Self {
        Self {
            reviewer: Arc::new(reviewer),
            jobs: OnceLock::new(),
            last_answer: AtomicU64::new(0),
            epoch: Instant::now(),
            within: TAKE_TURNS_WITHIN,
        }
    }

    /// Answers one review body: in turn with the others waiting when it comes close behind the
    /// last answer ([`TAKE_TURNS_WITHIN`]), else at once. Never panics on any input.
    pub async fn review(&self, body: Bytes) -> Answer {
        let received = Instant::now();
        let answer = match self.jobs().filter(|_| self.busy(received)) {
            Some(jobs) => self.in_turn(jobs, body, received).await,
            None => self.reviewer.review_received(&body, received).await,
        };
        let since_epoch = u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_answer
            .store(since_epoch.max(1), Ordering::Relaxed);
        answer
    }

    /// Whether the last review was answered less than [`TAKE_TURNS_WITHIN`] before `received`.
    fn busy(&self, received: Instant) -> bool {
        let last = self.last_answer.load(Ordering::Relaxed);
        let received = received.saturating_duration_since(self.epoch);
        last != 0 && received.saturating_sub(Duration::from_nanos(last)) < self.within
    }

    /// Hands the review to the reviewing task and waits for its answer; reviews here if the
    /// task is gone.
    async fn in_turn(
        &self,
        jobs: &mpsc::UnboundedSender<Job>,
        body: Bytes,
        received: Instant,
    ) -> Answer {
        let (reply, answer) = oneshot::channel();
        let job = Job {
            body: body.clone(),
            received,
            reply,
        };
        if jobs.send(job).is_ok()
            && let Ok(answer) = answer.await
        {
            return answer;
        }
        self.reviewer.review_received(&body, received).await
    }

    /// The queue to the reviewing task, started on first use; `None` outside a Tokio runtime.
    fn jobs(&self) -> Option<&mpsc::UnboundedSender<Job>> {
        self.jobs
            .get_or_init(|| {
                let runtime = tokio::runtime::Handle::try_current().ok()?;
                let (jobs, waiting) = mpsc::unbounded_channel();
                runtime.spawn(take_turns(Arc::clone(&self.reviewer), waiting));
                Some(jobs)
            })
            .as_ref()
    }
}

/// The reviewing task: takes what is waiting after each first body and reviews it in order,
/// until every sender is gone.
async fn take_turns(reviewer: Arc<Reviewer>, mut waiting: mpsc::UnboundedReceiver<Job>) {
    let mut batch = Vec::new();
    while let Some(first) = waiting.recv().await {
        // The first at once, so that a lone review waits for nothing.
        answer(&reviewer, first).await;
        // Then let the other connections with a request ready hand theirs over, and take them
        // in turn, until a pass of the runtime brings none.
        loop {
            tokio::task::yield_now().await;
            while let Ok(job) = waiting.try_recv() {
                batch.push(job);
            }
            if batch.is_empty() {
                break;
            }
            for job in batch.drain(..) {
                answer(&reviewer, job).await;
            }
        }
    }
}

/// Reviews `job` here if it needs no wait, or else on a task of its own, which answers it when
/// its namespace lookup returns.
async fn answer(reviewer: &Arc<Reviewer>, job: Job) {
    let Job {
        body,
        received,
        reply,
    } = job;
    let reviewer = Arc::clone(reviewer);
    let mut review: Pin<Box<dyn Future<Output = Answer> + Send>> =
        Box::pin(async move { reviewer.review_received(&body, received).await });
    match std::future::poll_fn(|cx| Poll::Ready(review.as_mut().poll(cx))).await {
        // The connection may have gone (timed out): nobody to answer.
        Poll::Ready(answer) => drop(reply.send(answer)),
        Poll::Pending => {
            tokio::spawn(async move { drop(reply.send(review.await)) });
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, time::Duration};

    use serde_json::{Value, json};
    use tokio::sync::Notify;

    use super::*;
    use crate::test_support::{cluster::FixedCluster, webhook::research_cluster};
    use crate::webhook::{
        cluster::{ClusterError, ClusterView},
        mutate::{MutationPolicy, PriorityClassInfo, PriorityClasses},
        review::Metrics,
    };

    /// A review of a research pod created in `namespace`, with request uid `uid`.
    fn body(uid: &str, namespace: &str) -> Bytes {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": namespace,
                "operation": "CREATE",
                "userInfo": {"username": "alice"},
                "object": {"metadata": {"name": "p"},
                    "spec": {"containers": [{"name": "main",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
            }
        });
        Bytes::from(review.to_string())
    }

    /// The uid and whether the answer allows the pod, from an answer's body.
    fn uid_and_allowed(answer: &Answer) -> (String, bool) {
        let Answer::Review(json) = answer else {
            panic!("not a review answer: {answer:?}");
        };
        let review: Value = serde_json::from_slice(json).expect("answer is JSON");
        let response = &review["response"];
        (
            response["uid"].as_str().unwrap_or_default().to_string(),
            response["allowed"].as_bool().unwrap_or_default(),
        )
    }

    /// The cluster of the tests: namespace `research` is a research namespace; a lookup of any
    /// other waits until `release` is notified, then finds no such namespace (as one that asks
    /// the API server about a namespace newer than the cache).
    struct SlowLookups {
        fixed: FixedCluster,
        release: Notify,
        /// The task each lookup ran on (`None`: the test's own future, not a task).
        tasks: std::sync::Mutex<Vec<Option<tokio::task::Id>>>,
    }

    impl PriorityClasses for SlowLookups {
        fn priority_class(&self, name: &str) -> Option<PriorityClassInfo> {
            self.fixed.priority_class(name)
        }
    }

    #[async_trait::async_trait]
    impl ClusterView for SlowLookups {
        async fn namespace_labels(
            &self,
            namespace: &str,
        ) -> Result<Option<BTreeMap<String, String>>, ClusterError> {
            if let Ok(mut tasks) = self.tasks.lock() {
                tasks.push(tokio::task::try_id());
            }
            if namespace != "research" {
                self.release.notified().await;
            }
            self.fixed.namespace_labels(namespace).await
        }
    }

    fn queue() -> (Arc<ReviewQueue>, Arc<SlowLookups>) {
        let cluster = Arc::new(SlowLookups {
            fixed: research_cluster(),
            release: Notify::new(),
            tasks: Default::default(),
        });
        let queue = ReviewQueue {
            // Every review after the first in turn, however slowly the test runs.
            within: Duration::MAX,
            ..ReviewQueue::new(Reviewer {
                policy: Arc::new(MutationPolicy::default()),
                cluster: cluster.clone(),
                metrics: Metrics::default(),
            })
        };
        (Arc::new(queue), cluster)
    }

    /// One review, answered at once (none before it), so that those after it are taken in turn.
    async fn first(queue: &ReviewQueue) {
        let answer = queue.review(body("first", "research")).await;
        assert_eq!(uid_and_allowed(&answer), ("first".to_string(), true));
    }

    /// Many connections at once, on a runtime of several workers: each gets the answer to its
    /// own review.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_connection_gets_the_answer_to_its_own_review() {
        let (queue, _) = queue();
        first(&queue).await;
        let reviews: Vec<_> = (0..200)
            .map(|i| {
                let queue = Arc::clone(&queue);
                tokio::spawn(async move {
                    let uid = format!("uid-{i}");
                    (uid.clone(), queue.review(body(&uid, "research")).await)
                })
            })
            .collect();
        for review in reviews {
            let (uid, answer) = review.await.expect("review task");
            assert_eq!(uid_and_allowed(&answer), (uid, true));
            let Answer::Review(json) = &answer else {
                unreachable!()
            };
            let text = String::from_utf8_lossy(json);
            assert!(
                text.contains("\"patch\""),
                "research pod not marked: {text}"
            );
        }
        assert_eq!(
            queue
                .reviewer
                .metrics
                .admissions(super::super::review::Outcome::Mutated),
            201
        );
        // Every review's wait for its turn is counted, and is part of its whole time.
        let timed = queue.reviewer.metrics.timed();
        assert_eq!(timed.waits, 201);
        let (wait, whole) = (timed.waiting, timed.seconds);
        assert!(0.0 < wait && wait < whole, "wait {wait} s of {whole} s");
    }

    /// A review whose namespace lookup waits does not hold up the reviews after it, and is
    /// answered when its lookup returns.
    #[tokio::test(flavor = "current_thread")]
    async fn a_review_waiting_on_its_lookup_does_not_hold_up_the_others() {
        let (queue, cluster) = queue();
        first(&queue).await;
        let slow = tokio::spawn({
            let queue = Arc::clone(&queue);
            async move { queue.review(body("slow", "created-just-now")).await }
        });
        // Let the slow review reach its lookup.
        tokio::task::yield_now().await;
        for i in 0..3 {
            let uid = format!("fast-{i}");
            let answer = tokio::time::timeout(
                Duration::from_secs(10),
                queue.review(body(&uid, "research")),
            )
            .await
            .expect("a review behind a waiting lookup is answered");
            assert_eq!(uid_and_allowed(&answer), (uid, true));
        }
        assert!(!slow.is_finished());
        cluster.release.notify_one();
        let answer = tokio::time::timeout(Duration::from_secs(10), slow)
            .await
            .expect("the waiting review is answered once its lookup returns")
            .expect("review task");
        assert_eq!(uid_and_allowed(&answer), ("slow".to_string(), true));
    }

    /// A review far from the one before is answered on its connection's own task; one close
    /// behind another, on the reviewing task.
    #[tokio::test(flavor = "current_thread")]
    async fn only_reviews_close_together_are_taken_in_turn() {
        let (queue, cluster) = queue();
        let far_apart = ReviewQueue {
            within: Duration::ZERO,
            ..ReviewQueue::new(Reviewer::clone(&queue.reviewer))
        };
        for _ in 0..3 {
            first(&far_apart).await;
        }
        for _ in 0..3 {
            first(&queue).await;
        }
        let tasks = cluster.tasks.lock().expect("lookups").clone();
        assert_eq!(tasks[..4], [None; 4], "answered on the test's own future");
        assert!(
            tasks[4..].iter().all(Option::is_some),
            "taken in turn: {tasks:?}"
        );
    }

    /// Outside a Tokio runtime there is no task to hand reviews to: the review is answered on
    /// the caller's own.
    #[test]
    fn outside_a_runtime_the_review_is_answered_in_place() {
        let (queue, _) = queue();
        let answer = futures::executor::block_on(queue.review(body("here", "research")));
        assert_eq!(uid_and_allowed(&answer), ("here".to_string(), true));
        assert!(queue.jobs.get().is_some_and(Option::is_none));
    }
}
