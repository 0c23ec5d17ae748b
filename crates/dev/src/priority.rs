//! CPU priority of a daemon's threads (docs/design/datapath.md, "Background work below the
//! host's"): the threads that serve host requests (connection threads, the drives' completion
//! and I/O threads) run at the process's own priority; the shared runtime's workers, which run
//! destage, GC, rebuilds, checkpoints and the control plane, may run a few nice levels below.
//!
//! On Linux a nice value belongs to a thread, and a new thread inherits its creator's. So a
//! drive's threads set their own priority from the process's main thread (its thread group
//! leader, whose priority nothing here changes) rather than trusting their creator, which may
//! be a background worker (a drive added by a job, say). Connection threads are started by the
//! daemon's main thread and inherit its priority.

use std::io;

use rustix::process::{Pid, getpid, getpriority_process, setpriority_process};
use rustix::thread::gettid;

/// The nice value of the process's main thread.
pub fn process_nice() -> io::Result<i32> {
    Ok(getpriority_process(Some(getpid()))?)
}

/// The calling thread's nice value.
pub fn thread_nice() -> io::Result<i32> {
    Ok(getpriority_process(Some(this_thread()))?)
}

/// Runs the calling thread at the process's priority (for threads that serve host requests).
pub fn run_as_foreground() -> io::Result<()> {
    set_thread_nice(process_nice()?)
}

/// [`run_as_foreground`] where it changes anything; where the thread may not raise its priority
/// (not root, and its creator ran lower), logs it once per process and goes on at the lower one.
pub fn foreground_or_warn(what: &str) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let (Ok(now), Ok(process)) = (thread_nice(), process_nice()) else { return };
    if now == process {
        return;
    }
    if let Err(e) = run_as_foreground() {
        WARNED.call_once(|| {
            tracing::warn!(
                thread = what,
                nice = now,
                process_nice = process,
                error = %e,
                "a thread serving host I/O could not take the process's priority and runs lower \
                 (started by a background thread; raising it needs CAP_SYS_NICE)"
            );
        });
    }
}

/// Runs the calling thread `levels` nice levels below the process (at most nice 19), for
/// background work. Returns the nice value set.
pub fn run_as_background(levels: u8) -> io::Result<i32> {
    let nice = (process_nice()? + i32::from(levels)).min(19);
    set_thread_nice(nice)?;
    Ok(nice)
}

fn set_thread_nice(nice: i32) -> io::Result<()> {
    Ok(setpriority_process(Some(this_thread()), nice)?)
}

/// The calling thread's id as `setpriority(PRIO_PROCESS, ...)` takes it on Linux.
fn this_thread() -> Pid {
    gettid()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_background_thread_runs_below_the_process_and_a_foreground_thread_at_its_level() {
        let base = process_nice().expect("the main thread's nice");
        std::thread::spawn(move || {
            let set = run_as_background(3).expect("lower this thread");
            assert_eq!(set, (base + 3).min(19));
            assert_eq!(thread_nice().expect("read it back"), set);
            // The process's (main thread's) priority is untouched.
            assert_eq!(process_nice().expect("main thread"), base);
            // A thread started by a background thread inherits its nice, and takes the
            // process's back as a foreground thread (raising a priority needs root).
            std::thread::spawn(move || {
                assert_eq!(thread_nice().expect("inherited"), set);
                if rustix::process::geteuid().is_root() {
                    foreground_or_warn("test");
                    assert_eq!(thread_nice().expect("read it back"), base);
                }
            })
            .join()
            .expect("foreground thread");
        })
        .join()
        .expect("background thread");
    }
}
