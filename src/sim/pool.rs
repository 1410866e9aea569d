//! The simulated GPU pool: nodes × GPUs shared by inference replicas and research jobs.
//!
//! Inference pods are placed first; when no node has room, research jobs are preempted the way
//! the kube-scheduler does it (pick one node, evict the fewest victims, wait out their grace
//! period). Research jobs fill what is left (minus a headroom), checkpoint periodically and lose
//! the work since their last checkpoint when preempted. Owns GPU and research accounting only.

use std::collections::VecDeque;

use serde::Serialize;

use super::config::ResearchConfig;

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
}

#[derive(Clone, Copy, Debug)]
struct Job {
    node: usize,
    gpus: u32,
    /// Seconds of work done (saved or not).
    progress: f64,
    /// When preempted: the time its grace period ends.
    leaves_at: Option<f64>,
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResearchStats {
    /// GPU-seconds held by research pods (running or in their grace period).
    pub lent_gpu_s: f64,
    /// GPU-seconds of work lost: progress since the last checkpoint and the grace period.
    pub lost_gpu_s: f64,
    pub preemptions: u64,
    pub completed_jobs: u64,
}

/// The pool's state.
#[derive(Clone, Debug)]
pub struct Pool {
    nodes: Vec<Node>,
    jobs: Vec<Job>,
    /// Progress of preempted jobs, resumed first (from their checkpoint).
    resume: VecDeque<f64>,
    research: ResearchConfig,
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
            return Placement::Nominated(n);
        }
        if let Some(n) = self.nodes.iter().position(|nd| nd.unclaimed() >= gpus) {
            self.nodes[n].inference += gpus;
            return Placement::Bound(n);
        }
        // Preemption: the node needing the fewest victims, then the least lost work.
        let mut best: Option<(usize, Vec<usize>, f64)> = None;
        for (n, node) in self.nodes.iter().enumerate() {
            let leaving = node.terminating;
            let room = (node.free() + leaving).saturating_sub(node.claimed);
            if room >= gpus {
                // Victims already leaving make room: no new preemption.
                best = Some((n, Vec::new(), 0.0));
                break;
            }
            let mut candidates: Vec<usize> = self
                .jobs
                .iter()
                .enumerate()
                .filter(|(_, j)| j.node == n && j.leaves_at.is_none())
                .map(|(i, _)| i)
                .collect();
            candidates.sort_by(|a, b| {
                self.unsaved(&self.jobs[*a])
                    .total_cmp(&self.unsaved(&self.jobs[*b]))
            });
            let mut got = room;
            let mut victims = Vec::new();
            let mut loss = 0.0;
            for i in candidates {
                if got >= gpus {
                    break;
                }
                got += self.jobs[i].gpus;
                loss += self.unsaved(&self.jobs[i]);
                victims.push(i);
            }
            if got < gpus {
                continue;
            }
            let better = match &best {
                None => true,
                Some((_, v, l)) => (victims.len(), loss) < (v.len(), *l),
            };
            if better {
                best = Some((n, victims, loss));
            }
        }
        let Some((n, victims, _)) = best else {
            return Placement::Unschedulable;
        };
        for i in victims {
            self.preempt(i, now);
        }
        self.nodes[n].claimed += gpus;
        Placement::Nominated(n)
    }

    /// A nominated pod went away before binding: its claim is dropped.
    pub fn unclaim(&mut self, node: usize, gpus: u32) {
        self.nodes[node].claimed = self.nodes[node].claimed.saturating_sub(gpus);
    }

    /// An inference pod left the node.
    pub fn release_inference(&mut self, node: usize, gpus: u32) {
        self.nodes[node].inference = self.nodes[node].inference.saturating_sub(gpus);
    }

    /// GPU-seconds of a job's work not yet checkpointed.
    fn unsaved(&self, job: &Job) -> f64 {
        let ci = self.research.checkpoint_interval_s;
        (job.progress - (job.progress / ci).floor() * ci) * f64::from(job.gpus)
    }

    fn preempt(&mut self, i: usize, now: f64) {
        let job = self.jobs[i];
        let grace = self.research.grace_period_s;
        let lost = self.unsaved(&job) + grace * f64::from(job.gpus);
        self.stats.lost_gpu_s += lost;
        self.stats.preemptions += 1;
        let ci = self.research.checkpoint_interval_s;
        self.resume.push_back((job.progress / ci).floor() * ci);
        let node = &mut self.nodes[job.node];
        node.research -= job.gpus;
        node.terminating += job.gpus;
        self.jobs[i].leaves_at = Some(now + grace);
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
                    job.progress += dt;
                    if job.progress >= duration {
                        node.research -= job.gpus;
                        self.stats.completed_jobs += 1;
                        self.jobs.swap_remove(i);
                        continue;
                    }
                }
            }
            i += 1;
        }
        let g = self.research.gpus_per_job;
        loop {
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
            let progress = self.resume.pop_front().unwrap_or(0.0);
            self.jobs.push(Job {
                node: n,
                gpus: g,
                progress,
                leaves_at: None,
            });
        }
    }
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
