//! The daemon's operations as jobs: every request that changes the pool, from the control socket
//! or the REST API, runs as a task of its own (so a client that goes away never cancels it half
//! way) and is listed with its progress while it runs and for a while after (`GET /api/v1/jobs`,
//! the dashboard's progress bars).

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use serde::Serialize;
use serde_json::Value;

use crate::ops::Progress;

/// Finished jobs kept for listing (the oldest goes first).
const FINISHED_JOBS_MAX: usize = 64;
/// Jobs running at once at most; more are refused (each holds a task and its request).
pub(crate) const RUNNING_JOBS_MAX: usize = 256;

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum JobState {
    Running,
    Done,
    Failed,
}

/// One job as listed.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct JobView {
    pub(crate) id: u64,
    /// The request's `op` (`scrub`, `drive-fail`, ...).
    pub(crate) op: String,
    /// The request as sent, JSON.
    pub(crate) request: Value,
    pub(crate) state: JobState,
    pub(crate) started_unix_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) finished_unix_ms: Option<u64>,
    /// The last progress reported (long operations only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) progress: Option<Progress>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    running: Vec<JobView>,
    finished: VecDeque<JobView>,
}

/// The job table.
#[derive(Debug, Default, Clone)]
pub(crate) struct Jobs {
    table: Arc<Mutex<Table>>,
}

pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Jobs {
    /// Registers a job for `request` (`op` is its name); `None` when too many run.
    pub(crate) fn begin(&self, op: String, request: Value) -> Option<u64> {
        let mut t = self.table.lock();
        if t.running.len() >= RUNNING_JOBS_MAX {
            return None;
        }
        t.next_id += 1;
        let id = t.next_id;
        t.running.push(JobView {
            id,
            op,
            request,
            state: JobState::Running,
            started_unix_ms: unix_ms(),
            finished_unix_ms: None,
            progress: None,
            result: None,
            error: None,
        });
        Some(id)
    }

    pub(crate) fn progress(&self, id: u64, p: Progress) {
        if let Some(job) = self.table.lock().running.iter_mut().find(|j| j.id == id) {
            job.progress = Some(p);
        }
    }

    /// Moves job `id` to the finished list with its outcome.
    pub(crate) fn finish(&self, id: u64, outcome: &anyhow::Result<Value>) {
        let mut t = self.table.lock();
        let Some(at) = t.running.iter().position(|j| j.id == id) else { return };
        let mut job = t.running.swap_remove(at);
        job.finished_unix_ms = Some(unix_ms());
        match outcome {
            Ok(v) => (job.state, job.result) = (JobState::Done, Some(v.clone())),
            Err(e) => (job.state, job.error) = (JobState::Failed, Some(format!("{e:#}"))),
        }
        if t.finished.len() == FINISHED_JOBS_MAX {
            t.finished.pop_front();
        }
        t.finished.push_back(job);
    }

    /// Running jobs first (oldest first), then finished ones (newest first).
    pub(crate) fn list(&self) -> Vec<JobView> {
        let t = self.table.lock();
        let mut running = t.running.clone();
        running.sort_by_key(|j| j.id);
        running.into_iter().chain(t.finished.iter().rev().cloned()).collect()
    }

    pub(crate) fn get(&self, id: u64) -> Option<JobView> {
        let t = self.table.lock();
        t.running.iter().chain(t.finished.iter()).find(|j| j.id == id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_move_from_running_to_finished_and_old_ones_go() {
        let jobs = Jobs::default();
        let a = jobs.begin("scrub".into(), Value::Null).expect("room");
        jobs.progress(a, Progress { what: "scrub".into(), done: 1, total: 4 });
        assert_eq!(jobs.get(a).expect("listed").progress.expect("progress").done, 1);
        jobs.finish(a, &Ok(Value::Bool(true)));
        let done = jobs.get(a).expect("kept");
        assert_eq!(done.state, JobState::Done);
        assert!(done.finished_unix_ms.is_some());
        let b = jobs.begin("drive-fail".into(), Value::Null).expect("room");
        jobs.finish(b, &Err(anyhow::anyhow!("no drive")));
        assert_eq!(jobs.get(b).expect("kept").error.as_deref(), Some("no drive"));
        for _ in 0..FINISHED_JOBS_MAX {
            let id = jobs.begin("status".into(), Value::Null).expect("room");
            jobs.finish(id, &Ok(Value::Null));
        }
        assert!(jobs.get(a).is_none(), "the oldest finished job was dropped");
        assert_eq!(jobs.list().len(), FINISHED_JOBS_MAX);
    }

    #[test]
    fn running_jobs_are_bounded() {
        let jobs = Jobs::default();
        for _ in 0..RUNNING_JOBS_MAX {
            jobs.begin("scrub".into(), Value::Null).expect("room");
        }
        assert!(jobs.begin("scrub".into(), Value::Null).is_none());
    }
}
