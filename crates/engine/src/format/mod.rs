//! The on-disk format (docs/on-disk-format.md): pure encoding and decoding, no I/O.

pub mod flush_record;
pub mod layout;
pub mod meta;
pub mod superblock;

use uuid::Uuid;

/// A structure read from a drive is not what it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// No stria magic: the bytes belong to something else (or nothing).
    #[error("not a stria structure (no magic)")]
    NotStria,
    /// The magic is there but the CRC does not match: torn or corrupted.
    #[error("{0} checksum mismatch (torn or corrupted)")]
    BadChecksum(&'static str),
    /// Written by a newer stria.
    #[error("unsupported format version {0}")]
    UnsupportedVersion(u32),
    /// A field holds a value that cannot be right.
    #[error("invalid {0}")]
    BadField(&'static str),
    /// Region offsets in a superblock are inconsistent.
    #[error("invalid drive layout: {0}")]
    BadLayout(&'static str),
    /// The drive cannot hold a stria layout.
    #[error("drive of {drive_bytes} bytes is too small; stria needs at least {min_bytes} bytes")]
    DriveTooSmall { drive_bytes: u64, min_bytes: u64 },
    /// The metadata payload does not parse.
    #[error("metadata payload does not parse: {0}")]
    BadPayload(String),
    /// The metadata does not fit its slot.
    #[error("metadata of {len_bytes} bytes does not fit the {slot_bytes}-byte slot")]
    MetadataTooLarge { len_bytes: u64, slot_bytes: u64 },
}

/// CRC32C of a 4 KiB structure whose last 4 bytes hold the CRC.
pub(crate) fn crc_of(block: &[u8]) -> u32 {
    stria_dev::crc::crc32c(&block[..block.len() - 4])
}

/// Stores `crc_of(block)` in the last 4 bytes.
pub(crate) fn seal_crc(block: &mut [u8]) {
    let n = block.len();
    let crc = crc_of(block);
    block[n - 4..].copy_from_slice(&crc.to_le_bytes());
}

/// CRC of a page whose CRC sits at bytes 12..16: covers bytes 16.. then bytes 0..12.
pub(crate) fn page_crc(page: &[u8]) -> u32 {
    stria_dev::crc::crc32c_parts(&[&page[16..], &page[..12]])
}

/// Little-endian field writer for fixed-size structures.
pub(crate) struct Writer {
    buf: Vec<u8>,
    size: usize,
}

impl Writer {
    pub(crate) fn new(size: usize) -> Writer {
        Writer { buf: Vec::with_capacity(size), size }
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    pub(crate) fn zeros(&mut self, n: usize) {
        self.buf.resize(self.buf.len() + n, 0);
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    /// A UTF-8 string in a NUL-padded field of `width` bytes (truncated at a char boundary).
    pub(crate) fn label(&mut self, s: &str, width: usize) {
        let mut end = s.len().min(width);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.bytes(&s.as_bytes()[..end]);
        self.zeros(width - end);
    }
    pub(crate) fn position(&self) -> usize {
        self.buf.len()
    }
    /// Pads to the fixed size (panics if the fields overran it: a bug in the encoder).
    pub(crate) fn finish(mut self) -> Vec<u8> {
        assert!(self.buf.len() <= self.size, "encoder overran its {} bytes", self.size);
        self.buf.resize(self.size, 0);
        self.buf
    }
}

/// Little-endian field reader over a slice the caller has length-checked.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        s
    }
    pub(crate) fn skip(&mut self, n: usize) {
        self.pos += n;
    }
    pub(crate) fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    pub(crate) fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8 bytes"))
    }
    pub(crate) fn uuid(&mut self) -> Uuid {
        Uuid::from_bytes(self.take(16).try_into().expect("16 bytes"))
    }
    pub(crate) fn label(&mut self, width: usize) -> Result<String, FormatError> {
        let raw = self.take(width);
        let end = raw.iter().position(|&b| b == 0).unwrap_or(width);
        String::from_utf8(raw[..end].to_vec()).map_err(|_| FormatError::BadField("label is not UTF-8"))
    }
}
