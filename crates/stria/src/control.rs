//! The daemon's control socket: while `stria serve` owns a pool, every other `stria` command
//! reaches it here instead of touching the drives.
//!
//! Protocol: the client sends one JSON line `{"request": <Request>}`; the daemon answers with
//! any number of `{"progress": <Progress>}` lines and one final `{"ok": <result>}` or
//! `{"error": {"message": "<message>", "kind": "<kind>"}}` line (the kind: `stria_engine::ErrorKind`
//! in snake case), then closes.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::ops::{Progress, Request};
use crate::refusal::Refusal;
use stria_engine::ErrorKind;

/// Longest request line accepted (a request is a few hundred bytes).
const REQUEST_BYTES_MAX: usize = 64 << 10;

#[derive(Debug, Serialize, Deserialize)]
struct Envelope {
    request: Request,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Reply {
    Progress(Progress),
    Ok(Value),
    Error { message: String, kind: ErrorKind },
}

/// True when a daemon answers on `socket`.
pub(crate) async fn daemon_running(socket: &Path) -> bool {
    UnixStream::connect(socket).await.is_ok()
}

/// Sends a request to the daemon; `progress` sees progress lines.
pub(crate) async fn call(
    socket: &Path,
    request: Request,
    mut progress: impl FnMut(Progress),
) -> Result<Value> {
    let stream = UnixStream::connect(socket)
        .await
        .with_context(|| format!("cannot reach the daemon at {}", socket.display()))?;
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_vec(&Envelope { request })?;
    line.push(b'\n');
    write.write_all(&line).await?;
    let mut lines = BufReader::new(read).lines();
    while let Some(line) = lines.next_line().await? {
        match serde_json::from_str::<Reply>(&line).context("the daemon sent a malformed reply")? {
            Reply::Progress(p) => progress(p),
            Reply::Ok(v) => return Ok(v),
            Reply::Error { message, kind } => return Err(Refusal { kind, message }.into()),
        }
    }
    bail!("the daemon closed the connection without an answer")
}

/// What the daemon does with a request.
pub(crate) type Handler = Arc<
    dyn Fn(Request, tokio::sync::mpsc::UnboundedSender<Progress>) -> futures_like::BoxFuture<Result<Value>>
        + Send
        + Sync,
>;

pub(crate) mod futures_like {
    /// A boxed, sendable future.
    pub(crate) type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;
}

/// Serves the control socket until the task is aborted.
pub(crate) async fn serve(listener: UnixListener, handler: Handler) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let handler = Arc::clone(&handler);
        tokio::spawn(async move {
            if let Err(e) = handle(stream, handler).await {
                tracing::warn!(error = %e, "control connection failed");
            }
        });
    }
}

async fn handle(stream: UnixStream, handler: Handler) -> Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    let n = (&mut reader).take(REQUEST_BYTES_MAX as u64).read_until(b'\n', &mut line).await?;
    if n == 0 {
        return Ok(());
    }
    let reply = match serde_json::from_slice::<Envelope>(&line) {
        Err(e) => Reply::Error { message: format!("malformed request: {e}"), kind: ErrorKind::InvalidInput },
        Ok(env) => {
            tracing::info!(request = ?env.request, "control request");
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut work = handler(env.request, tx);
            loop {
                tokio::select! {
                    result = &mut work => {
                        while let Ok(p) = rx.try_recv() {
                            send(&mut write, &Reply::Progress(p)).await?;
                        }
                        break match result {
                            Ok(v) => Reply::Ok(v),
                            Err(e) => Reply::Error { message: format!("{e:#}"), kind: crate::refusal::kind_of(&e) },
                        };
                    }
                    Some(p) = rx.recv() => send(&mut write, &Reply::Progress(p)).await?,
                }
            }
        }
    };
    send(&mut write, &reply).await
}

async fn send(write: &mut tokio::net::unix::OwnedWriteHalf, reply: &Reply) -> Result<()> {
    let mut line = serde_json::to_vec(reply)?;
    line.push(b'\n');
    write.write_all(&line).await?;
    Ok(())
}

use tokio::io::AsyncReadExt as _;
