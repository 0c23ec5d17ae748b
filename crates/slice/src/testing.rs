//! A TCP proxy for tests of slice servers and nodes: the network faults a test applies between a
//! coordinator and a slice server (there is no netem here, docs/design/cluster.md §11.2).
//! Connections through it can be cut (they break, as a dropped link breaks them), new ones refused
//! while those already made keep working (a node cut off from one peer but not from another), and
//! every byte delayed, each way, by a latency the test sets and changes at will (order kept).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A proxy on 127.0.0.1 in front of `to`; stops (and breaks its connections) when dropped.
#[derive(Debug)]
pub struct Proxy {
    pub addr: SocketAddr,
    accept: JoinHandle<()>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// One-way latency added to every byte, microseconds.
    delay_us: Arc<AtomicU64>,
}

/// Copies `from` to `to`, each chunk `delay` after it arrived (read on at once, so the delay is
/// latency, not a rate limit). Reader and writer run in the caller's task: a cut (abort) drops
/// the bytes still in flight, as a broken link does.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay_us: Arc<AtomicU64>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = from.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let due = Instant::now() + Duration::from_micros(delay_us.load(Ordering::Relaxed));
            if tx.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let write = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due.into()).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

impl Proxy {
    pub async fn start(to: SocketAddr) -> io::Result<Proxy> {
        Proxy::start_at(SocketAddr::from(([127, 0, 0, 1], 0)), to).await
    }

    /// A proxy listening on `listen`: a node that comes back at the address it had (tries for
    /// a second while the old listener is being dropped).
    pub async fn start_at(listen: SocketAddr, to: SocketAddr) -> io::Result<Proxy> {
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(listen).await {
                Ok(l) => break l,
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && tries < 20 => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let addr = listener.local_addr()?;
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let delay_us: Arc<AtomicU64> = Arc::default();
        let held = Arc::clone(&conns);
        let delay = Arc::clone(&delay_us);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let delay = Arc::clone(&delay);
                held.lock().push(tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(to).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        // Both directions end when this task is aborted (a cut).
                        tokio::join!(pump(cr, sw, Arc::clone(&delay)), pump(sr, cw, delay));
                    }
                }));
            }
        });
        Ok(Proxy { addr, accept, conns, delay_us })
    }

    /// Delays every byte through the proxy by `delay`, each way, from now on (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        self.delay_us.store(u64::try_from(delay.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Breaks every connection through the proxy (new ones are accepted again).
    pub fn cut(&self) {
        for c in self.conns.lock().drain(..) {
            c.abort();
        }
    }

    /// Refuses new connections; those already made keep working.
    pub fn refuse_new(&self) {
        self.accept.abort();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}
