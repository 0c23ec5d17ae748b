//! NBD (Network Block Device) protocol server for stria volumes.
//!
//! The crate defines the port it serves, [`Export`] (one block device; the daemon implements it
//! for its volumes) and [`ExportRegistry`] (exports by name, changeable while serving), and a
//! [`Server`] that speaks the fixed newstyle NBD protocol over Unix sockets or TCP, with optional
//! TLS. `docs/nbd.md` at the repository root lists the protocol subset, limits and guarantees.
//!
//! Layout: [`proto`] holds the protocol's numbers, [`wire`] its pure parsers and encoders (what
//! the fuzzer drives), `handshake` the option haggling, `transmission` the per-connection request
//! engine, `server` listeners and shutdown. [`MemExport`] is a sparse in-memory export for tests
//! and the `nbd-mem-server` example. [`NbdClient`] is a small pipelined client (what a cluster
//! node forwards a volume's requests with).
//!
//! ```no_run
//! use std::sync::Arc;
//! use stria_nbd::{ExportMap, MemExport, Server, ServerConfig};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let exports = Arc::new(ExportMap::new());
//! exports.insert("disk", Arc::new(MemExport::new(1 << 30)))?;
//! let server = Server::new(ServerConfig::default(), exports)?;
//! let handle = server.serve_unix("/tmp/nbd.sock")?;
//! // ... later
//! handle.shutdown().await;
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod admission;
mod budget;
pub mod client;
mod config;
mod conn_io;
mod export;
#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod mem;
mod page_table;
pub mod proto;
mod server;
mod slots;
mod transmission;
mod warn_limit;
pub mod wire;

pub use admission::ServerStats;
pub use client::{ClientError, NbdClient};
pub use config::{ConfigError, Limits, ServerConfig, TlsConfig, TlsMode};
pub use export::{
    BoxFuture, Export, ExportError, ExportMap, ExportRegistry, Extent, NamedExport, RegistryError,
};
pub use mem::{MEM_MAX_EXTENTS, MEM_PAGE_BYTES, MemExport};
pub use proto::Errno;
pub use server::{ListenAddr, NbdStream, Server, ServerHandle};
