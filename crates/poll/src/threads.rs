//! Connection threads: a connection's requests stay on one thread from the socket to the drive
//! and back (docs/design/datapath.md, "Connections on threads of their own").
//!
//! Each thread runs a current-thread Tokio runtime of its own. A front end hands every accepted
//! connection to the thread with the fewest live connections (the first of those, counting
//! from the one after the last choice, on a tie), and the connection's task runs there to its
//! end: its socket is registered with that thread's reactor, its requests are read, executed
//! (down to the drive calls that the engines make inline) and answered on that thread, and no
//! other thread polls it. The process's shared runtime keeps the work that is not a
//! connection's (accepting, background tasks, the control plane), so a connection never waits
//! for it to be scheduled, and background work never runs on a connection's thread.
//!
//! Dropping [`ConnectionThreads`] tells every thread to stop; a thread then drops what still runs
//! on it (the front end's own shutdown ends its connections first) and exits. The threads are
//! not joined (the last owner may be a task on one of them).

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::runtime::{Builder, Handle};
use tokio::sync::oneshot;

/// Most connection threads one set may have.
pub const MAX_THREADS: usize = 1024;

/// One thread: its runtime's handle, its live connections, and how to stop it.
#[derive(Debug)]
struct Thread {
    handle: Handle,
    live: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
}

/// A set of connection threads (see the module's documentation).
#[derive(Debug)]
pub struct ConnectionThreads {
    threads: Vec<Thread>,
    /// Where the search for the least loaded thread starts next (spreads ties).
    next: AtomicUsize,
}

/// Counts a connection on its thread until the connection's task ends or is dropped.
struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnectionThreads {
    /// Starts `count` threads (1 ..= [`MAX_THREADS`]) named `name-N`, each with `stack_bytes` of
    /// stack. If one cannot be started, those already started are stopped.
    pub fn start(count: usize, name: &str, stack_bytes: usize) -> io::Result<ConnectionThreads> {
        if count == 0 || count > MAX_THREADS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("connection threads must be 1 to {MAX_THREADS}, not {count}"),
            ));
        }
        let mut threads = Vec::with_capacity(count);
        for i in 0..count {
            let runtime = Builder::new_current_thread().enable_all().build()?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new().name(format!("{name}-{i}")).stack_size(stack_bytes).spawn(
                move || {
                    // Runs the connections spawned onto it until told to stop (or until the set is
                    // dropped, which drops the sender); dropping the runtime then drops the tasks left.
                    runtime.block_on(async move {
                        // The thread's own io_uring for the file drives its connections call
                        // (stria_dev::file::local), reaped by a task of this runtime.
                        match stria_dev::file::local::install() {
                            Ok(Some(reaper)) => drop(tokio::spawn(reaper.run())),
                            Ok(None) => {}
                            Err(error) => {
                                tracing::debug!(%error, "no io_uring of the thread's own: file drives use their own rings");
                            }
                        }
                        let _ = stopped.await;
                    });
                },
            )?;
            threads.push(Thread { handle, live: Arc::new(AtomicUsize::new(0)), stop: Some(stop) });
        }
        Ok(ConnectionThreads { threads, next: AtomicUsize::new(0) })
    }

    /// How many threads the set has.
    pub fn len(&self) -> usize {
        self.threads.len()
    }

    /// Always false: a set has at least one thread.
    pub fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// Live connections per thread, in thread order.
    pub fn live(&self) -> Vec<usize> {
        self.threads.iter().map(|t| t.live.load(Ordering::Relaxed)).collect()
    }

    /// Runs `connection` to its end on the thread with the fewest live connections, and returns
    /// that thread's index. The future is first polled on that thread, inside its runtime, so
    /// it may register sockets there (`from_std`).
    pub fn spawn<F>(&self, connection: F) -> usize
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let n = self.threads.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let chosen = (0..n)
            .map(|k| (start + k) % n)
            .min_by_key(|&i| self.threads[i].live.load(Ordering::Relaxed))
            .expect("at least one thread");
        let thread = &self.threads[chosen];
        thread.live.fetch_add(1, Ordering::Relaxed);
        let live = Live(Arc::clone(&thread.live));
        thread.handle.spawn(async move {
            let _live = live;
            connection.await;
        });
        chosen
    }
}

impl Drop for ConnectionThreads {
    fn drop(&mut self) {
        for thread in &mut self.threads {
            if let Some(stop) = thread.stop.take() {
                let _ = stop.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
        for _ in 0..2000 {
            if cond() {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("timed out waiting until {what}");
    }

    #[test]
    fn a_connection_runs_to_its_end_on_one_thread_of_the_set() {
        let threads = ConnectionThreads::start(2, "test-conn", 1 << 20).expect("threads start");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = Arc::clone(&seen);
        let (go, wait) = oneshot::channel::<()>();
        threads.spawn(async move {
            s.lock().unwrap().push(std::thread::current().name().map(str::to_owned));
            // Sleeps and wakes from another thread: still polled on its own.
            tokio::time::sleep(Duration::from_millis(5)).await;
            s.lock().unwrap().push(std::thread::current().name().map(str::to_owned));
            let _ = wait.await;
            s.lock().unwrap().push(std::thread::current().name().map(str::to_owned));
        });
        wait_until("the connection has slept once", || seen.lock().unwrap().len() == 2);
        go.send(()).unwrap();
        wait_until("the connection has ended", || threads.live() == vec![0, 0]);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        let first = seen[0].clone().expect("a named thread");
        assert!(first.starts_with("test-conn-"), "ran on {first}");
        assert!(
            seen.iter().all(|name| name.as_deref() == Some(first.as_str())),
            "moved between threads: {seen:?}"
        );
    }

    #[test]
    fn connections_go_to_the_thread_with_the_fewest() {
        let threads = ConnectionThreads::start(3, "test-spread", 1 << 20).expect("threads start");
        let mut stops = Vec::new();
        let mut kept = Vec::new();
        let mut chosen = Vec::new();
        for _ in 0..6 {
            let (stop, stopped) = oneshot::channel::<()>();
            stops.push(stop);
            chosen.push(threads.spawn(async move {
                let _ = stopped.await;
            }));
        }
        assert_eq!(threads.live(), vec![2, 2, 2], "chosen: {chosen:?}");
        // Ending the connections of thread 1 sends the next two there.
        for (i, stop) in stops.into_iter().enumerate() {
            if chosen[i] == 1 {
                let _ = stop.send(());
            } else {
                kept.push(stop);
            }
        }
        wait_until("thread 1 is empty", || threads.live()[1] == 0);
        let next: Vec<usize> = (0..2).map(|_| threads.spawn(std::future::pending())).collect();
        assert_eq!(next, vec![1, 1]);
        assert_eq!(threads.live(), vec![2, 2, 2]);
        drop(kept);
    }

    #[test]
    fn a_set_of_no_threads_is_refused() {
        assert!(ConnectionThreads::start(0, "none", 1 << 20).is_err());
        assert!(ConnectionThreads::start(MAX_THREADS + 1, "many", 1 << 20).is_err());
    }

    #[test]
    fn dropping_the_set_drops_what_still_runs_on_it() {
        let threads = ConnectionThreads::start(1, "test-drop", 1 << 20).expect("threads start");
        let (dropped, was_dropped) = std::sync::mpsc::channel::<()>();
        struct Tell(std::sync::mpsc::Sender<()>);
        impl Drop for Tell {
            fn drop(&mut self) {
                let _ = self.0.send(());
            }
        }
        let tell = Tell(dropped);
        threads.spawn(async move {
            let _tell = tell;
            std::future::pending::<()>().await;
        });
        drop(threads);
        was_dropped
            .recv_timeout(Duration::from_secs(5))
            .expect("the task was dropped when its thread stopped");
    }
}
