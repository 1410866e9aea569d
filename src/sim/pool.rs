//! The simulated GPU pool: nodes × GPUs shared by inference replicas and research jobs.
//!
//! Inference pods are placed first; when no node has room, research jobs are preempted by the
//! simulated kube-scheduler ([`super::scheduler`]: lower classes first, then the most recently
//! started; their grace period is waited out). Research jobs, each of one of the scenario's
//! research PriorityClasses, fill what is left (minus a headroom), checkpoint periodically and
//! lose the work since their last completed checkpoint when preempted. With reclaim notices
//! ([`Pool::notice`]), the jobs the live controller's predictor ([`crate::core::notice`]) says
//! the next replicas will displace are warned, and their trainer keeps
//! its unsaved work short while the notice lasts: it writes a checkpoint whenever
//! `notice_checkpoint_every_s` of work are unsaved (at most `notice_checkpoints_max` times per
//! notice), training nothing while it writes. The predictor is not the scheduler: whether its
//! warnings went to the jobs the scheduler then took is counted ([`NoticeOutcomes`]).
//! Owns GPU and research accounting only.

use std::collections::VecDeque;

use serde::Serialize;

use super::config::ResearchConfig;
use super::scheduler::{self, Bound, Decision, Incoming};
use crate::core::notice::{self, Candidate, NodeRoom};

/// Priority of inference pods: the `nightshift-inference` PriorityClass of the base manifests,
/// above every research class.
pub const INFERENCE_PRIORITY: i32 = 1_000_000;

#[derive(Clone, Copy, Debug, Default)]
struct Node {
    total: u32,
    inference: u32,
    research: u32,
    /// GPUs of preempted research pods still in their grace period.
    terminating: u32,
    /// GPUs promised to inference pods waiting for victims to leave.
    claimed: u32,
}

impl Node {
    fn free(&self) -> u32 {
        self.total - self.inference - self.research - self.terminating
    }
    fn unclaimed(&self) -> u32 {
        self.free().saturating_sub(self.claimed)
    }
    /// GPUs neither held nor promised, negative while nominated pods wait for GPUs still held
    /// (what the scheduler filters on).
    fn available(&self) -> i64 {
        i64::from(self.free()) - i64::from(self.claimed)
    }
}

#[derive(Clone, Copy, Debug)]
struct Job {
    /// Unique for the run (victim predictions name jobs by it).
    id: u64,
    node: usize,
    gpus: u32,
    /// Its PriorityClass's value (the scheduler preempts the lowest first).
    priority: i32,
    /// When it started on its node (within a class, the scheduler preempts the most recent
    /// first).
    started: f64,
    /// Seconds of work done (saved or not).
    progress: f64,
    /// Progress saved by the latest completed notice checkpoint (or the checkpoint it resumed
    /// from).
    notice_saved: f64,
    /// When the reclaim notice it holds was given, if it holds one.
    notice_at: Option<f64>,
    /// Checkpoints started under the notice it holds.
    notice_writes: u32,
    /// The notice checkpoint it is writing, if any.
    writing: Option<Writing>,
    /// When preempted: the time it leaves (its grace period ends, or sooner).
    leaves_at: Option<f64>,
}

/// A checkpoint being written from `start` to `done_at`, saving `progress`.
#[derive(Clone, Copy, Debug)]
struct Writing {
    start: f64,
    done_at: f64,
    progress: f64,
}

/// Where an inference pod goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Bound to the node: it holds its GPUs from now.
    Bound(usize),
    /// Nominated to the node: victims are leaving; try again later.
    Nominated(usize),
    /// No node can make room (inference holds it all).
    Unschedulable,
}

/// Research totals, in GPU-seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResearchStats {
    /// GPU-seconds held by research pods (running or in their grace period).
    pub lent_gpu_s: f64,
    /// GPU-seconds of work lost: progress since the last checkpoint and the grace period.
    pub lost_gpu_s: f64,
    pub preemptions: u64,
    pub completed_jobs: u64,
    /// Reclaim notices given; of them withdrawn (demand fell back first), and held by jobs that
    /// finished their work under notice.
    pub notices: u64,
    pub notices_withdrawn: u64,
    pub notices_completed: u64,
    /// Preemptions of jobs under notice: not writing a checkpoint (their unsaved work kept
    /// short), and caught writing one that cannot end within the grace period (lost).
    pub preempted_after_checkpoint: u64,
    pub preempted_during_checkpoint: u64,
    /// Preemptions without notice while other jobs held notices: the predictor named others.
    /// (The rest of the unwarned came before any notice: demand outran the notice.)
    pub preempted_in_place_of_warned: u64,
    /// GPU-seconds jobs spent writing notice checkpoints (no training meanwhile), completed or
    /// not; included in `lost_gpu_s`.
    pub notice_checkpoint_gpu_s: f64,
    /// Seconds from notice to preemption, for every preempted job that had one.
    #[serde(skip)]
    pub lead_times_s: Vec<f64>,
}

/// The pool's state.
#[derive(Clone, Debug)]
pub struct Pool {
    nodes: Vec<Node>,
    jobs: Vec<Job>,
    /// Progress and priority of preempted jobs, resumed first (from their checkpoint, in their
    /// class).
    resume: VecDeque<(f64, i32)>,
    research: ResearchConfig,
    next_id: u64,
    pub stats: ResearchStats,
}

impl Pool {
    pub fn new(nodes: u32, gpus_per_node: u32, research: ResearchConfig) -> Pool {
        Pool {
            nodes: (0..nodes)
                .map(|_| Node {
                    total: gpus_per_node,
                    ..Node::default()
                })
                .collect(),
            jobs: Vec::new(),
            resume: VecDeque::new(),
            research,
            next_id: 0,
            stats: ResearchStats::default(),
        }
    }

    pub fn total_gpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.total).sum()
    }

    pub fn inference_gpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.inference).sum()
    }

    /// GPUs held by research pods, running or terminating.
    pub fn research_gpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.research + n.terminating).sum()
    }

    /// Places an inference pod needing `gpus`, preempting research if it must.
    pub fn place_inference(&mut self, gpus: u32, nominated: Option<usize>, now: f64) -> Placement {
        if let Some(n) = nominated {
            let node = &mut self.nodes[n];
            if node.free() >= gpus {
                node.claimed = node.claimed.saturating_sub(gpus);
                node.inference += gpus;
                return Placement::Bound(n);
            }
            // While its victims terminate the pod waits for them; once none is left and it
            // still does not fit, the scheduler drops the nomination and decides again.
            if node.terminating > 0 {
                return Placement::Nominated(n);
            }
            self.unclaim(n, gpus);
        }
        let pod = Incoming {
            gpus,
            priority: INFERENCE_PRIORITY,
        };
        match scheduler::schedule(&self.scheduler_view(), pod) {
            Decision::Bind(n) => {
                self.nodes[n].inference += gpus;
                Placement::Bound(n)
            }
            Decision::Preempt { node, victims } => {
                for id in victims {
                    // A victim already leaving is not preempted again.
                    if let Some(i) = self
                        .jobs
                        .iter()
                        .position(|j| j.id == id && j.leaves_at.is_none())
                    {
                        self.preempt(i, now);
                    }
                }
                self.nodes[node].claimed += gpus;
                Placement::Nominated(node)
            }
            Decision::Unschedulable => Placement::Unschedulable,
        }
    }

    /// The pool as the scheduler sees it: per node, the GPUs no pod holds or is nominated to,
    /// and every research pod bound there (those in their grace period too).
    fn scheduler_view(&self) -> Vec<scheduler::Node<u64>> {
        let mut nodes: Vec<scheduler::Node<u64>> = self
            .nodes
            .iter()
            .map(|n| scheduler::Node {
                free: n.available(),
                pods: Vec::new(),
            })
            .collect();
        for j in &self.jobs {
            nodes[j.node].pods.push(Bound {
                id: j.id,
                gpus: j.gpus,
                priority: j.priority,
                started: j.started,
                // Research pods carry no PodDisruptionBudget in the simulation.
                guarded: false,
            });
        }
        nodes
    }

    /// GPUs of node `n` an inference pod can have once the pods leaving it are gone and the
    /// pods nominated to it have theirs.
    fn room(&self, n: usize) -> u32 {
        let node = &self.nodes[n];
        (node.free() + node.terminating).saturating_sub(node.claimed)
    }

    /// The pool as the live controller's predictor reads it: each node's room once the pods
    /// leaving it are gone, and its running research jobs.
    fn rooms(&self) -> Vec<NodeRoom<u64>> {
        let mut rooms: Vec<NodeRoom<u64>> = (0..self.nodes.len())
            .map(|n| NodeRoom {
                free: self.room(n),
                research: Vec::new(),
            })
            .collect();
        for j in self.jobs.iter().filter(|j| j.leaves_at.is_none()) {
            rooms[j.node].research.push(Candidate {
                id: j.id,
                gpus: j.gpus,
                priority: j.priority,
                started: j.started,
            });
        }
        rooms
    }

    /// Reclaim notices for the services' next inference pods, `(replicas, gpus each)` per
    /// service in the services' order (as the live controller places them: one service after
    /// another on one view of the pool): the jobs the scheduler would preempt for them get a
    /// notice (and checkpoint at once if enough work is unsaved); jobs holding a notice that are
    /// no longer among them have it withdrawn (a checkpoint being written is finished: it is
    /// paid for and will save).
    pub fn notice(&mut self, now: f64, wanted: &[(u32, u32)]) {
        let mut rooms = self.rooms();
        let mut victims = Vec::new();
        for &(replicas, gpus) in wanted {
            victims.extend(notice::predict_victims(&mut rooms, replicas, gpus));
        }
        for job in self.jobs.iter_mut().filter(|j| j.leaves_at.is_none()) {
            let chosen = victims.contains(&job.id);
            match (chosen, job.notice_at) {
                (true, None) => {
                    job.notice_at = Some(now);
                    job.notice_writes = 0;
                    self.stats.notices += 1;
                    checkpoint_if_due(job, now, &self.research);
                }
                (false, Some(_)) => {
                    job.notice_at = None;
                    self.stats.notices_withdrawn += 1;
                }
                _ => {}
            }
        }
    }

    /// A nominated pod went away before binding: its claim is dropped.
    pub fn unclaim(&mut self, node: usize, gpus: u32) {
        self.nodes[node].claimed = self.nodes[node].claimed.saturating_sub(gpus);
    }

    /// An inference pod left the node.
    pub fn release_inference(&mut self, node: usize, gpus: u32) {
        self.nodes[node].inference = self.nodes[node].inference.saturating_sub(gpus);
    }

    fn preempt(&mut self, i: usize, now: f64) {
        let job = self.jobs[i];
        let ci = self.research.checkpoint_interval_s;
        let grace = self.research.grace_period_s;
        let write_s = self.research.notice_checkpoint_s;
        let saved = saved(&job, ci);
        let g = f64::from(job.gpus);
        // What the job saves on SIGTERM and how long it holds its GPUs after it.
        let (saved, hold) = match job.writing {
            // A checkpoint that ends within the grace period is finished, then the job exits.
            Some(w) if w.done_at <= now + grace => {
                let hold = (w.done_at - now).max(0.0);
                self.stats.notice_checkpoint_gpu_s += hold * g;
                (saved.max(w.progress), hold)
            }
            // Killed at the end of the grace period, mid-write: the checkpoint is lost.
            Some(_) => {
                self.stats.notice_checkpoint_gpu_s += grace * g;
                (saved, grace)
            }
            // A trainer under notice handles SIGTERM: it saves if a checkpoint fits in the
            // grace period, and exits at once otherwise (nothing else it could save).
            None if job.notice_at.is_some() => {
                if write_s <= grace && job.progress > saved {
                    self.stats.notice_checkpoint_gpu_s += write_s * g;
                    (job.progress, write_s)
                } else {
                    (saved, 0.0)
                }
            }
            // Without notice the trainer runs on until killed at the end of the grace period.
            None => (saved, grace),
        };
        self.stats.lost_gpu_s += (job.progress - saved) * g + hold * g;
        self.stats.preemptions += 1;
        if job.notice_at.is_none() && self.jobs.iter().any(|j| j.notice_at.is_some()) {
            self.stats.preempted_in_place_of_warned += 1;
        }
        if let Some(at) = job.notice_at {
            self.stats.lead_times_s.push(now - at);
            if job.writing.is_some_and(|w| w.done_at > now + grace) {
                self.stats.preempted_during_checkpoint += 1;
            } else {
                self.stats.preempted_after_checkpoint += 1;
            }
        }
        self.resume.push_back((saved, job.priority));
        let node = &mut self.nodes[job.node];
        node.research -= job.gpus;
        node.terminating += job.gpus;
        self.jobs[i].leaves_at = Some(now + hold);
    }

    /// Advances research by `dt` ending at `now`: progress, completions, grace periods ending,
    /// and new jobs placed on unclaimed GPUs as long as `headroom` GPUs stay free.
    pub fn tick_research(&mut self, now: f64, dt: f64, headroom: u32) {
        let duration = self.research.job_hours * 3600.0;
        let mut i = 0;
        while i < self.jobs.len() {
            let job = &mut self.jobs[i];
            self.stats.lent_gpu_s += dt * f64::from(job.gpus);
            let node = &mut self.nodes[job.node];
            match job.leaves_at {
                Some(t) if t <= now => {
                    node.terminating -= job.gpus;
                    self.jobs.swap_remove(i);
                    continue;
                }
                Some(_) => {}
                None => {
                    // Writing a notice checkpoint: no training meanwhile.
                    let mut training = dt;
                    if let Some(w) = job.writing {
                        let writing = (now.min(w.done_at) - (now - dt).max(w.start)).max(0.0);
                        training -= writing;
                        self.stats.notice_checkpoint_gpu_s += writing * f64::from(job.gpus);
                        self.stats.lost_gpu_s += writing * f64::from(job.gpus);
                        if now >= w.done_at {
                            job.notice_saved = job.notice_saved.max(w.progress);
                            job.writing = None;
                        }
                    }
                    job.progress += training;
                    checkpoint_if_due(job, now, &self.research);
                    if job.progress >= duration {
                        node.research -= job.gpus;
                        self.stats.completed_jobs += 1;
                        if job.notice_at.is_some() {
                            self.stats.notices_completed += 1;
                        }
                        self.jobs.swap_remove(i);
                        continue;
                    }
                }
            }
            i += 1;
        }
        let g = self.research.gpus_per_job;
        // The controller's rule: nothing more is lent while a notice is out.
        let warned = self.jobs.iter().filter(|j| j.notice_at.is_some()).count();
        loop {
            if !notice::may_lend(warned) {
                break;
            }
            let free: u32 = self.nodes.iter().map(Node::unclaimed).sum();
            if free < g + headroom {
                break;
            }
            // Best fit: the fullest node with room keeps whole nodes free for inference.
            let Some(n) = (0..self.nodes.len())
                .filter(|n| self.nodes[*n].unclaimed() >= g)
                .min_by_key(|n| self.nodes[*n].unclaimed())
            else {
                break;
            };
            self.nodes[n].research += g;
            let (progress, priority) = self
                .resume
                .pop_front()
                .unwrap_or_else(|| (0.0, self.research.class_of(self.next_id)));
            self.next_id += 1;
            self.jobs.push(Job {
                id: self.next_id,
                node: n,
                gpus: g,
                priority,
                started: now,
                progress,
                notice_saved: progress,
                notice_at: None,
                notice_writes: 0,
                writing: None,
                leaves_at: None,
            });
        }
    }
}

/// Progress `job` can resume from: its last periodic checkpoint (every `ci` seconds of work)
/// or its last completed notice checkpoint, whichever is later.
fn saved(job: &Job, ci: f64) -> f64 {
    let periodic = (job.progress / ci).floor() * ci;
    periodic.max(job.notice_saved)
}

/// The trainer under notice: it starts a checkpoint at `now` when `notice_checkpoint_every_s`
/// of work are unsaved, unless it is writing one or has written `notice_checkpoints_max` under
/// this notice already.
fn checkpoint_if_due(job: &mut Job, now: f64, research: &ResearchConfig) {
    if job.notice_at.is_some()
        && job.writing.is_none()
        && job.notice_writes < research.notice_checkpoints_max
        && unsaved(job, research.checkpoint_interval_s) >= research.notice_checkpoint_every_s
    {
        job.notice_writes += 1;
        job.writing = Some(Writing {
            start: now,
            done_at: now + research.notice_checkpoint_s,
            progress: job.progress,
        });
    }
}

/// Seconds of `job`'s work a preemption would lose now.
fn unsaved(job: &Job, ci: f64) -> f64 {
    job.progress - saved(job, ci)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn research() -> ResearchConfig {
        ResearchConfig {
            gpus_per_job: 4,
            job_hours: 10.0,
            checkpoint_interval_s: 600.0,
            grace_period_s: 30.0,
            notice_checkpoint_s: 120.0,
            notice_checkpoint_every_s: 300.0,
            notice_checkpoints_max: u32::MAX,
            classes: ResearchConfig::default().classes,
        }
    }

    #[test]
    fn research_fills_spare_gpus_but_keeps_the_headroom() {
        let mut pool = Pool::new(2, 8, research());
        pool.tick_research(1.0, 1.0, 4);
        assert_eq!(pool.research_gpus(), 12);
        let mut pool = Pool::new(2, 8, research());
        pool.tick_research(1.0, 1.0, 0);
        assert_eq!(pool.research_gpus(), 16);
    }

    #[test]
    fn preemption_loses_work_since_the_last_checkpoint_and_the_grace_period() {
        let mut pool = Pool::new(1, 8, research());
        pool.tick_research(0.0, 0.0, 0); // two jobs placed
        for t in 1..=1000 {
            pool.tick_research(f64::from(t), 1.0, 0);
        }
        // 1000 s of work each, checkpoint at 600 s: 400 s × 4 GPUs unsaved per job.
        assert_eq!(
            pool.place_inference(4, None, 1000.0),
            Placement::Nominated(0)
        );
        assert_eq!(pool.stats.preemptions, 1);
        assert_eq!(pool.stats.lost_gpu_s, 400.0 * 4.0 + 30.0 * 4.0);
        // The GPUs stay held for the grace period, then the pod binds.
        pool.tick_research(1010.0, 10.0, 0);
        assert_eq!(
            pool.place_inference(4, Some(0), 1010.0),
            Placement::Nominated(0)
        );
        pool.tick_research(1030.0, 20.0, 0);
        assert_eq!(
            pool.place_inference(4, Some(0), 1030.0),
            Placement::Bound(0)
        );
        assert_eq!(pool.inference_gpus(), 4);
        assert_eq!(pool.research_gpus(), 4);
        // Lent = both jobs for 1030 s (the victim's grace included).
        assert_eq!(pool.stats.lent_gpu_s, 2.0 * 4.0 * 1030.0);
    }

    #[test]
    fn a_preempted_job_resumes_from_its_checkpoint() {
        let mut pool = Pool::new(1, 4, research());
        pool.tick_research(0.0, 0.0, 0);
        for t in 1..=700 {
            pool.tick_research(f64::from(t), 1.0, 0);
        }
        pool.place_inference(4, None, 700.0);
        for t in 701..=730 {
            pool.tick_research(f64::from(t), 1.0, 0);
        }
        assert_eq!(pool.place_inference(4, Some(0), 730.0), Placement::Bound(0));
        pool.release_inference(0, 4);
        pool.tick_research(731.0, 1.0, 0);
        assert_eq!(pool.jobs.len(), 1);
        assert_eq!(pool.jobs[0].progress, 600.0);
    }

    #[test]
    fn free_gpus_are_used_before_preempting_and_inference_never_preempts_inference() {
        let mut pool = Pool::new(2, 8, research());
        pool.tick_research(0.0, 0.0, 8); // one node's worth lent
        assert_eq!(pool.place_inference(8, None, 0.0), Placement::Bound(1));
        assert_eq!(pool.stats.preemptions, 0);
        assert_eq!(pool.place_inference(8, None, 0.0), Placement::Nominated(0));
        assert_eq!(pool.stats.preemptions, 2);
        pool.tick_research(30.0, 30.0, 0);
        assert_eq!(pool.place_inference(8, Some(0), 30.0), Placement::Bound(0));
        assert_eq!(
            pool.place_inference(4, None, 30.0),
            Placement::Unschedulable
        );
    }

    #[test]
    fn gpus_promised_to_a_nominated_pod_are_not_promised_twice() {
        let mut pool = Pool::new(1, 8, research());
        pool.tick_research(0.0, 0.0, 0); // two 4-GPU jobs
        assert_eq!(pool.place_inference(4, None, 0.0), Placement::Nominated(0));
        // The first victim's GPUs are the first pod's: the second pod needs the other job.
        assert_eq!(pool.place_inference(4, None, 0.0), Placement::Nominated(0));
        assert_eq!(pool.stats.preemptions, 2);
        pool.tick_research(30.0, 30.0, 0);
        assert_eq!(pool.place_inference(4, Some(0), 30.0), Placement::Bound(0));
        assert_eq!(pool.place_inference(4, Some(0), 30.0), Placement::Bound(0));
    }

    #[test]
    fn a_nominated_pod_with_no_victim_left_to_wait_for_is_scheduled_again() {
        let mut pool = Pool::new(2, 4, research());
        pool.tick_research(0.0, 0.0, 0); // one 4-GPU job per node
        // Nominated to node 1 with nothing leaving there: preempted afresh.
        assert_eq!(
            pool.place_inference(4, Some(1), 0.0),
            Placement::Nominated(0)
        );
        assert_eq!(pool.stats.preemptions, 1);
    }

    /// One 4-GPU job on a 4-GPU node, run for 1000 s (periodic checkpoint at 600 s), then
    /// warned for one 4-GPU replica at 1000 s.
    fn warned_job() -> Pool {
        let mut pool = Pool::new(1, 4, research());
        pool.tick_research(0.0, 0.0, 0);
        for t in 1..=1000 {
            pool.tick_research(f64::from(t), 1.0, 0);
        }
        pool.notice(1000.0, &[(1, 4)]);
        assert_eq!(pool.stats.notices, 1);
        pool
    }

    #[test]
    fn notices_for_several_services_warn_for_each_in_turn_on_one_view_of_the_pool() {
        // Two 4-GPU nodes, each full of research: one job per node.
        let mut pool = Pool::new(2, 4, research());
        pool.tick_research(0.0, 0.0, 0);
        run_to(&mut pool, 0, 100);
        assert_eq!(pool.jobs.len(), 2);
        // One service wants a replica: one job is warned.
        pool.notice(100.0, &[(1, 4)]);
        assert_eq!(pool.stats.notices, 1);
        // A second service wants one more: its replica cannot land where the first's will, so
        // the other job is warned too, and the first warning stands.
        pool.notice(105.0, &[(1, 4), (1, 4)]);
        assert_eq!(pool.stats.notices, 2);
        assert_eq!(pool.stats.notices_withdrawn, 0);
        assert!(pool.jobs.iter().all(|j| j.notice_at.is_some()));
        // The first service no longer needs its replica: the job the second service's replica
        // now lands on keeps its notice, the other's is withdrawn.
        pool.notice(110.0, &[(0, 4), (1, 4)]);
        assert_eq!(pool.stats.notices_withdrawn, 1);
        assert_eq!(
            pool.jobs.iter().filter(|j| j.notice_at.is_some()).count(),
            1
        );
    }

    fn run_to(pool: &mut Pool, from: u32, to: u32) {
        for t in from + 1..=to {
            pool.tick_research(f64::from(t), 1.0, 0);
        }
    }

    #[test]
    fn a_warned_job_checkpoints_and_loses_only_what_it_trained_since() {
        let mut pool = warned_job();
        // 400 s unsaved ≥ 300: it writes at once, 1000–1120, training nothing.
        run_to(&mut pool, 1000, 1120);
        assert_eq!(pool.jobs[0].progress, 1000.0);
        assert_eq!(pool.jobs[0].notice_saved, 1000.0);
        run_to(&mut pool, 1120, 1200);
        assert_eq!(
            pool.place_inference(4, None, 1200.0),
            Placement::Nominated(0)
        );
        // 120 s writing + 80 s trained since; it exits at once (no grace period held).
        assert_eq!(pool.stats.lost_gpu_s, (120.0 + 80.0) * 4.0);
        assert_eq!(pool.stats.notice_checkpoint_gpu_s, 120.0 * 4.0);
        assert_eq!(pool.stats.preempted_after_checkpoint, 1);
        assert_eq!(pool.stats.lead_times_s, vec![200.0]);
        assert_eq!(
            pool.place_inference(4, Some(0), 1200.0),
            Placement::Nominated(0)
        );
        pool.tick_research(1201.0, 1.0, 0);
        assert_eq!(
            pool.place_inference(4, Some(0), 1201.0),
            Placement::Bound(0)
        );
    }

    #[test]
    fn under_notice_the_trainer_checkpoints_again_as_work_piles_up() {
        let mut pool = warned_job();
        // Written at 1120 (progress 1000), periodic at progress 1200 (t = 1320); 300 s more
        // unsaved at progress 1500 (t = 1620): the next one, 1620–1740.
        run_to(&mut pool, 1000, 1619);
        assert!(pool.jobs[0].writing.is_none());
        run_to(&mut pool, 1619, 1620);
        assert!(pool.jobs[0].writing.is_some());
        run_to(&mut pool, 1620, 1740);
        assert_eq!(pool.jobs[0].notice_saved, 1500.0);
        assert_eq!(pool.stats.notice_checkpoint_gpu_s, 240.0 * 4.0);
        // Withdrawn: no more checkpoints beyond the periodic ones.
        pool.notice(1740.0, &[(0, 4)]);
        assert_eq!(pool.stats.notices_withdrawn, 1);
        run_to(&mut pool, 1740, 2400);
        assert!(pool.jobs[0].writing.is_none());
        assert_eq!(pool.stats.notice_checkpoint_gpu_s, 240.0 * 4.0);
    }

    #[test]
    fn at_most_the_configured_checkpoints_per_notice() {
        let mut pool = warned_job();
        pool.research.notice_checkpoints_max = 1;
        run_to(&mut pool, 1000, 2400);
        assert_eq!(
            pool.stats.notice_checkpoint_gpu_s,
            120.0 * 4.0,
            "only the first"
        );
        // A new notice may write again.
        pool.notice(2400.0, &[(0, 4)]);
        pool.notice(2400.0, &[(1, 4)]);
        run_to(&mut pool, 2400, 2401);
        assert!(pool.jobs[0].writing.is_some());
    }

    #[test]
    fn a_checkpoint_cut_short_by_preemption_saves_nothing() {
        let mut pool = warned_job();
        run_to(&mut pool, 1000, 1050);
        pool.place_inference(4, None, 1050.0);
        // Ends at 1120, after the grace period (1080): killed mid-write.
        assert_eq!(pool.stats.preempted_during_checkpoint, 1);
        assert_eq!(
            pool.stats.lost_gpu_s,
            (50.0 + 400.0 + 30.0) * 4.0,
            "writing, unsaved work, grace"
        );
        assert_eq!(pool.resume.front().map(|r| r.0), Some(600.0));
    }

    #[test]
    fn a_checkpoint_ending_within_the_grace_period_is_finished() {
        let mut pool = warned_job();
        run_to(&mut pool, 1000, 1100);
        pool.place_inference(4, None, 1100.0);
        assert_eq!(pool.stats.preempted_after_checkpoint, 1);
        // 100 s written before, 20 s in the grace period; nothing unsaved.
        assert_eq!(pool.stats.lost_gpu_s, 120.0 * 4.0);
        assert_eq!(pool.stats.notice_checkpoint_gpu_s, 120.0 * 4.0);
        assert_eq!(pool.resume.front().map(|r| r.0), Some(1000.0));
        assert_eq!(pool.jobs[0].leaves_at, Some(1120.0));
    }

    #[test]
    fn little_unsaved_work_is_not_worth_a_checkpoint() {
        let mut pool = Pool::new(1, 4, research());
        pool.tick_research(0.0, 0.0, 0);
        run_to(&mut pool, 0, 700);
        // 100 s unsaved < 300: no checkpoint yet; preempted, it exits at once.
        pool.notice(700.0, &[(1, 4)]);
        run_to(&mut pool, 700, 750);
        assert!(pool.jobs[0].writing.is_none());
        pool.place_inference(4, None, 750.0);
        assert_eq!(pool.stats.lost_gpu_s, 150.0 * 4.0);
        assert_eq!(pool.stats.notice_checkpoint_gpu_s, 0.0);
    }

    #[test]
    fn finished_jobs_free_their_gpus_for_the_next() {
        let mut cfg = research();
        cfg.job_hours = 1.0 / 3600.0 * 10.0; // 10 s jobs
        let mut pool = Pool::new(1, 4, cfg);
        pool.tick_research(0.0, 0.0, 0);
        for t in 1..=25 {
            pool.tick_research(f64::from(t), 1.0, 0);
        }
        assert_eq!(pool.stats.completed_jobs, 2);
        assert_eq!(pool.research_gpus(), 4);
    }
}
