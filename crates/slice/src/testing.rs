//! A TCP proxy for tests of slice servers and nodes: the network faults a test applies between a
//! coordinator and a slice server. Connections through it can be cut (they break, as a dropped
//! link breaks them), and new ones refused while those already made keep working (a node cut off
//! from one peer but not from another). The delays of docs/design/cluster.md §11.2 will go here.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A proxy on 127.0.0.1 in front of `to`; stops (and breaks its connections) when dropped.
#[derive(Debug)]
pub struct Proxy {
    pub addr: SocketAddr,
    accept: JoinHandle<()>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
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
        let held = Arc::clone(&conns);
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                held.lock().push(tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                }));
            }
        });
        Ok(Proxy { addr, accept, conns })
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
