//! A real etcd member per test (its own ports and data directory, stopped with SIGTERM then
//! SIGKILL) and slice servers on 127.0.0.1 (the fault proxy is `stria_slice::testing::Proxy`).

use std::net::{SocketAddr, TcpListener as StdListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stria_cluster::{
    ClusterError, Coordinated, Keys, NodeRecord, Session, SessionConfig, SliceInfoRecord, SliceRef,
    VolumeRecord, coordinator,
};
use stria_dev::IoBytes;
use stria_dev::mem::MemDevice;
use stria_slice::{Slice, SliceSet, serve};
use tokio::net::TcpListener;
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One etcd member, started for a test and stopped when dropped.
pub(crate) struct Etcd {
    child: Child,
    pub(crate) endpoint: String,
    _dir: tempfile::TempDir,
}

impl Etcd {
    pub(crate) async fn start() -> Etcd {
        let dir = tempfile::tempdir().unwrap();
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).unwrap();
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd is not installed: `apt-get install etcd-server` (scripts/test.sh does)");
        let etcd = Etcd { child, endpoint, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = async {
                let mut c = etcd_client::Client::connect([&etcd.endpoint], None).await.ok()?;
                c.get("ready", None).await.ok()
            };
            if tokio::time::timeout(Duration::from_secs(2), ready).await.ok().flatten().is_some() {
                return etcd;
            }
            assert!(Instant::now() < deadline, "etcd did not answer within 20 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A node's session on this etcd with a short lease (`ttl`).
    pub(crate) async fn session(&self, node: &str, ttl: Duration) -> Session {
        let record = NodeRecord {
            name: node.into(),
            slice_addr: "127.0.0.1:0".into(),
            nbd_addr: None,
            slices: Vec::new(),
        };
        self.session_as(record, ttl).await
    }

    /// A session that registers `record` (a node with slices other nodes can find).
    pub(crate) async fn session_as(&self, record: NodeRecord, ttl: Duration) -> Session {
        let mut config = SessionConfig::new(vec![self.endpoint.clone()], &record.name);
        config.ttl = ttl;
        config.margin = Duration::from_millis(200);
        config.keys = Keys::new("/stria-test/v1");
        Session::start(config, &record).await.unwrap()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        // SAFETY: kill(2) on our own child's pid, which is not reaped until wait() below.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node's slice server with memory slices.
pub(crate) struct SliceNode {
    pub(crate) name: String,
    pub(crate) addr: SocketAddr,
    pub(crate) slices: Arc<SliceSet<Arc<MemDevice>>>,
    task: JoinHandle<std::io::Result<()>>,
}

impl SliceNode {
    pub(crate) async fn start(name: &str, slices: u32, bytes: u64) -> SliceNode {
        let mut list = Vec::new();
        for id in 0..slices {
            let dev = Arc::new(MemDevice::new(&format!("{name}-{id}"), bytes + 4096));
            list.push(Slice::format(id, dev).await.unwrap());
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let slices = Arc::new(SliceSet::new(list));
        let task = tokio::spawn(serve(listener, Arc::clone(&slices)));
        SliceNode { name: name.into(), addr, slices, task }
    }

    pub(crate) fn slice(&self, id: u32) -> SliceRef {
        SliceRef { node: self.name.clone(), addr: self.addr.to_string(), slice: id }
    }

    /// The node's record as its own session registers it, its slices reached at `addr`.
    pub(crate) fn record(&self, addr: SocketAddr) -> NodeRecord {
        NodeRecord {
            name: self.name.clone(),
            slice_addr: addr.to_string(),
            nbd_addr: None,
            slices: self
                .slices
                .ids()
                .into_iter()
                .map(|id| SliceInfoRecord { id, bytes: self.slices.get(id).unwrap().usable_bytes() })
                .collect(),
        }
    }
}

impl Drop for SliceNode {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The bytes of register `block` holding value `(writer, seq)`: unique per write, checkable.
pub(crate) fn register(block: u64, writer: u8, seq: u32) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[0..8].copy_from_slice(&block.to_le_bytes());
    b[8] = writer;
    b[9..13].copy_from_slice(&seq.to_le_bytes());
    for (i, x) in b[16..].iter_mut().enumerate() {
        *x = (i as u8) ^ writer ^ (seq as u8) ^ (block as u8);
    }
    b
}

pub(crate) const REGISTERS: u64 = 64;

pub(crate) async fn take_when_free(session: &Session, volume: &str, limit: Duration) -> Coordinated {
    let start = Instant::now();
    loop {
        match coordinator::take(session, &Handle::current(), volume).await {
            Ok(c) => return c,
            Err(ClusterError::Owned { .. }) if start.elapsed() < limit => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("takeover of {volume}: {e}"),
        }
    }
}

/// Writes every register once as `writer` (FUA: acknowledged means durable).
pub(crate) async fn write_registers(c: &Coordinated, writer: u8, seq: u32) {
    for block in 0..REGISTERS {
        c.volume.write(block * 4096, IoBytes::copy_from(&register(block, writer, seq)), true).await.unwrap();
    }
}

pub(crate) async fn check_registers(c: &Coordinated, writer: u8, seq: u32) {
    for block in 0..REGISTERS {
        let got = c.volume.read(block * 4096, 4096).await.unwrap();
        assert!(
            got[..] == register(block, writer, seq)[..],
            "register {block} lost writer {writer} seq {seq}"
        );
    }
}

/// A 4 MiB volume of `layout` on `slices`, in 64 KiB chunks: the spec most of these tests use.
pub(crate) fn small_spec(name: &str, layout: stria_engine::Layout, slices: Vec<SliceRef>) -> VolumeRecord {
    VolumeRecord { name: name.into(), layout, size_bytes: 4 << 20, chunk_bytes: 64 << 10, slices }
}
