//! Slice servers on 127.0.0.1 for the scenarios.

use std::net::SocketAddr;
use std::sync::Arc;

use stria_dev::BlockDevice;
use stria_dev::mem::MemDevice;
use stria_slice::{RemoteDevice, Slice, SliceSet, serve};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One node's slice server: its address, its slices and the task serving them.
pub(crate) struct Node<D: BlockDevice> {
    pub(crate) addr: SocketAddr,
    pub(crate) slices: Arc<SliceSet<D>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl<D: BlockDevice> Node<D> {
    /// Serves `slices` on a free port of 127.0.0.1 (or on `addr`).
    pub(crate) async fn start(slices: Vec<Slice<D>>, addr: Option<SocketAddr>) -> Node<D> {
        let listener =
            TcpListener::bind(addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap())).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let slices = Arc::new(SliceSet::new(slices));
        let task = tokio::spawn(serve(listener, Arc::clone(&slices)));
        Node { addr, slices, task }
    }

    /// Stops accepting connections (connections already open are served until they close).
    pub(crate) fn stop(&self) {
        self.task.abort();
    }
}

impl<D: BlockDevice> Drop for Node<D> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A node with one fresh memory slice (id 0) of `bytes` usable bytes, and the device under it.
pub(crate) async fn mem_node(name: &str, bytes: u64) -> (Node<Arc<MemDevice>>, Arc<MemDevice>) {
    let dev = Arc::new(MemDevice::new(name, bytes + 4096));
    let slice = Slice::format(0, Arc::clone(&dev)).await.unwrap();
    (Node::start(vec![slice], None).await, dev)
}

/// A remote device for slice 0 of `addr`, fenced at `epoch`.
pub(crate) async fn owner(addr: SocketAddr, epoch: u64) -> RemoteDevice {
    let dev = RemoteDevice::connect(&tokio::runtime::Handle::current(), addr, 0, epoch).await.unwrap();
    dev.fence(epoch).await.unwrap();
    dev
}
