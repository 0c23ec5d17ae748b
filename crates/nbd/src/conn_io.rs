//! Poll-based buffered I/O for the transmission phase: [`RequestReader`] cuts requests out of
//! the byte stream (write payloads land straight in an [`IoBuf`]), [`OutQueue`] collects reply
//! headers and read data and sends them with vectored writes. Both keep their state in the struct,
//! so a poll that returns `Pending` loses nothing.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use stria_dev::IoBuf;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::wire::{self, FramingError, REQUEST_HEADER_BYTES, RequestHeader};

/// Size of the read buffer: holds a few dozen small requests, so one read syscall serves many.
const READ_BUFFER_BYTES: usize = 256 << 10;
/// A write payload with at least this much still to come is read directly into its buffer.
const DIRECT_READ_MIN_BYTES: usize = 64 << 10;

/// A request cut from the stream, with its payload if it is a write.
#[derive(Debug)]
pub(crate) struct Incoming {
    pub(crate) header: RequestHeader,
    pub(crate) payload: Option<IoBuf>,
}

struct PendingWrite {
    header: RequestHeader,
    data: IoBuf,
    filled: usize,
}

/// Splits the incoming byte stream into requests.
pub(crate) struct RequestReader {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    pending: Option<PendingWrite>,
    max_payload_bytes: u32,
}

impl RequestReader {
    pub(crate) fn new(max_payload_bytes: u32) -> RequestReader {
        RequestReader {
            buf: vec![0u8; READ_BUFFER_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            pending: None,
            max_payload_bytes,
        }
    }

    /// The header of the next request, if it is complete in the buffer and no write payload is
    /// arriving, without consuming it: what admission decides on. Errors are those
    /// [`RequestReader::next_request`] would return for it.
    pub(crate) fn peek_header(&self) -> Result<Option<RequestHeader>, FramingError> {
        if self.pending.is_some() || self.end - self.start < REQUEST_HEADER_BYTES {
            return Ok(None);
        }
        let bytes: &[u8; REQUEST_HEADER_BYTES] = self.buf[self.start..self.start + REQUEST_HEADER_BYTES]
            .try_into()
            .expect("slice of header length");
        let header = wire::parse_request_header(bytes)?;
        wire::request_payload_bytes(&header, self.max_payload_bytes)?;
        Ok(Some(header))
    }

    /// True while a write's payload is partly received.
    pub(crate) fn has_partial_request(&self) -> bool {
        self.pending.is_some() || self.end > self.start
    }

    /// True while a write's payload is partly received (and must be read before anything else).
    pub(crate) fn mid_payload(&self) -> bool {
        self.pending.is_some()
    }

    /// The next complete request in the buffer, if any.
    pub(crate) fn next_request(&mut self) -> Result<Option<Incoming>, FramingError> {
        loop {
            if let Some(pending) = self.pending.as_mut() {
                let want = pending.data.len() - pending.filled;
                let take = want.min(self.end - self.start);
                pending.data[pending.filled..pending.filled + take]
                    .copy_from_slice(&self.buf[self.start..self.start + take]);
                pending.filled += take;
                self.start += take;
                if pending.filled < pending.data.len() {
                    return Ok(None);
                }
                let done = self.pending.take().expect("checked above");
                return Ok(Some(Incoming { header: done.header, payload: Some(done.data) }));
            }
            if self.end - self.start < REQUEST_HEADER_BYTES {
                return Ok(None);
            }
            let bytes: &[u8; REQUEST_HEADER_BYTES] = self.buf[self.start..self.start + REQUEST_HEADER_BYTES]
                .try_into()
                .expect("slice of header length");
            let header = wire::parse_request_header(bytes)?;
            let payload_bytes = wire::request_payload_bytes(&header, self.max_payload_bytes)?;
            self.start += REQUEST_HEADER_BYTES;
            if payload_bytes == 0 {
                let payload = (header.kind == crate::proto::cmd::WRITE).then(|| IoBuf::zeroed(0));
                return Ok(Some(Incoming { header, payload }));
            }
            let len = usize::try_from(payload_bytes).expect("u32 fits usize");
            // Every byte is filled from the socket before the payload is handed on (a connection
            // that ends first drops it), so it need not be zeroed.
            self.pending = Some(PendingWrite { header, data: IoBuf::for_overwrite(len), filled: 0 });
        }
    }

    /// True when a read can make progress (there is room to read into).
    pub(crate) fn can_fill(&self) -> bool {
        self.pending.is_some() || self.end - self.start < self.buf.len()
    }

    /// Reads more bytes from `stream`. `Ready(Ok(0))` is end of stream.
    pub(crate) fn poll_fill<S: AsyncRead + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        stream: Pin<&mut S>,
    ) -> Poll<io::Result<usize>> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if let Some(pending) = self.pending.as_mut() {
            let want = pending.data.len() - pending.filled;
            if self.start == self.end && want >= DIRECT_READ_MIN_BYTES {
                let mut target = ReadBuf::new(&mut pending.data[pending.filled..]);
                ready!(stream.poll_read(cx, &mut target))?;
                let got = target.filled().len();
                pending.filled += got;
                return Poll::Ready(Ok(got));
            }
        }
        if self.start > 0 && self.buf.len() - self.end < REQUEST_HEADER_BYTES.max(self.buf.len() / 4) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        assert!(self.end < self.buf.len(), "poll_fill called with a full buffer");
        let mut target = ReadBuf::new(&mut self.buf[self.end..]);
        ready!(stream.poll_read(cx, &mut target))?;
        let got = target.filled().len();
        self.end += got;
        Poll::Ready(Ok(got))
    }
}

enum Segment {
    Bytes(Vec<u8>),
    Data(IoBuf),
}

impl Segment {
    fn as_slice(&self) -> &[u8] {
        match self {
            Segment::Bytes(bytes) => bytes,
            Segment::Data(data) => data,
        }
    }
}

/// Largest reply-header segment before a new one is started.
const BYTES_SEGMENT_MAX: usize = 64 << 10;
/// Read data up to this size is copied next to its reply header instead of sent from its own
/// buffer: a small copy costs less than one more slice in the vectored write, and many small
/// replies then leave in one `writev` segment.
const INLINE_DATA_MAX_BYTES: usize = 16 << 10;
/// Most slices passed to one vectored write.
const MAX_IOVECS: usize = 64;

/// Replies waiting to be written.
pub(crate) struct OutQueue {
    segments: VecDeque<Segment>,
    /// Bytes of the front segment already written.
    front_written: usize,
    queued_bytes: usize,
    spare: Vec<Vec<u8>>,
    needs_flush: bool,
}

impl OutQueue {
    pub(crate) fn new() -> OutQueue {
        OutQueue {
            segments: VecDeque::new(),
            front_written: 0,
            queued_bytes: 0,
            spare: Vec::new(),
            needs_flush: false,
        }
    }

    /// Unsent bytes.
    pub(crate) fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// True when bytes were written since the last flush.
    pub(crate) fn needs_flush(&self) -> bool {
        self.needs_flush
    }

    /// Appends small bytes (reply headers) with `encode`.
    pub(crate) fn encode(&mut self, encode: impl FnOnce(&mut Vec<u8>)) {
        let reuse = matches!(self.segments.back(), Some(Segment::Bytes(bytes)) if bytes.len() < BYTES_SEGMENT_MAX)
            // The front segment may be partly written; appending to it is still fine.
            ;
        if !reuse {
            let fresh = self.spare.pop().unwrap_or_else(|| Vec::with_capacity(4096));
            self.segments.push_back(Segment::Bytes(fresh));
        }
        let Some(Segment::Bytes(bytes)) = self.segments.back_mut() else { unreachable!("pushed above") };
        let before = bytes.len();
        encode(bytes);
        self.queued_bytes += bytes.len() - before;
    }

    /// Appends a data buffer, sent without copying.
    pub(crate) fn push_data(&mut self, data: IoBuf) {
        if data.is_empty() {
            return;
        }
        if data.len() <= INLINE_DATA_MAX_BYTES {
            self.encode(|bytes| bytes.extend_from_slice(&data));
            return;
        }
        self.queued_bytes += data.len();
        self.segments.push_back(Segment::Data(data));
    }

    /// Drops everything queued (the peer is gone).
    pub(crate) fn clear(&mut self) {
        self.segments.clear();
        self.front_written = 0;
        self.queued_bytes = 0;
        self.needs_flush = false;
    }

    /// Writes as much as one vectored write takes.
    pub(crate) fn poll_write<S: AsyncWrite + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        stream: Pin<&mut S>,
    ) -> Poll<io::Result<usize>> {
        let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
        let mut count = 0;
        for (position, segment) in self.segments.iter().enumerate().take(MAX_IOVECS) {
            let bytes = segment.as_slice();
            slices[count] = IoSlice::new(if position == 0 { &bytes[self.front_written..] } else { bytes });
            count += 1;
        }
        let written = ready!(stream.poll_write_vectored(cx, &slices[..count]))?;
        if written == 0 {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::WriteZero, "peer accepts no more bytes")));
        }
        self.needs_flush = true;
        self.advance(written);
        Poll::Ready(Ok(written))
    }

    /// Flushes the stream (TLS buffers records until flushed).
    pub(crate) fn poll_flush<S: AsyncWrite + ?Sized>(
        &mut self,
        cx: &mut Context<'_>,
        stream: Pin<&mut S>,
    ) -> Poll<io::Result<()>> {
        ready!(stream.poll_flush(cx))?;
        self.needs_flush = false;
        Poll::Ready(Ok(()))
    }

    fn advance(&mut self, mut written: usize) {
        self.queued_bytes -= written;
        while written > 0 {
            let front = self.segments.front().expect("wrote more than was queued");
            let left = front.as_slice().len() - self.front_written;
            if written < left {
                self.front_written += written;
                return;
            }
            written -= left;
            self.front_written = 0;
            if let Some(Segment::Bytes(mut bytes)) = self.segments.pop_front()
                && self.spare.len() < 4
            {
                bytes.clear();
                self.spare.push(bytes);
            }
        }
    }
}
