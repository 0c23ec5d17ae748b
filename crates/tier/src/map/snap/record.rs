//! The layers' log records: preserve (copy) records and the table records of a delete, beside
//! the entry deltas in the map log (docs/on-disk-format.md §7).

use super::{BLOCK_MASK, CONTROL_TAG, OP_DROP, OP_OWN, OP_PRESERVE};
use crate::map::MapEntry;

/// The bytes of a preserve record: (block field, 16 bytes).
pub(in crate::map) fn encode_preserve(layer: u16, page: u64, pool: u32, table: u32) -> (u64, [u8; 16]) {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&page.to_le_bytes());
    b[8..12].copy_from_slice(&pool.to_le_bytes());
    b[12..16].copy_from_slice(&table.to_le_bytes());
    (CONTROL_TAG << 48 | OP_PRESERVE << 32 | u64::from(layer), b)
}

/// A change to the snapshots' tables made by a delete: logged, durable, then applied (an
/// assignment, so replaying it twice is harmless).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::map) enum TableOp {
    /// Snapshot `to` (the next older) takes over `from`'s copy of head page `page`, pool page
    /// `pool`, with table page `table` made for it if it has none there (else 0).
    Own { from: u16, to: u16, page: u64, pool: u32, table: u32 },
    /// Snapshot `layer` lets go of its copy of head page `page`, pool page `pool`.
    Drop { layer: u16, page: u64, pool: u32 },
}

/// The bytes of a table record: (block field, 16 bytes).
pub(in crate::map) fn encode_table_op(op: TableOp) -> (u64, [u8; 16]) {
    let mut b = [0u8; 16];
    let (field, page, pool, table) = match op {
        TableOp::Own { from, to, page, pool, table } => {
            (OP_OWN << 32 | u64::from(to) << 16 | u64::from(from), page, pool, table)
        }
        TableOp::Drop { layer, page, pool } => (OP_DROP << 32 | u64::from(layer), page, pool, 0),
    };
    b[0..8].copy_from_slice(&page.to_le_bytes());
    b[8..12].copy_from_slice(&pool.to_le_bytes());
    b[12..16].copy_from_slice(&table.to_le_bytes());
    (CONTROL_TAG << 48 | field, b)
}

/// A decoded log record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::map) enum Record {
    Entry { layer: u16, block: u64, entry: MapEntry },
    Preserve { layer: u16, page: u64, pool: u32, table: u32 },
    Table(TableOp),
}

pub(in crate::map) fn decode_record(field: u64, b: &[u8]) -> Option<Record> {
    let tag = field >> 48;
    if tag != CONTROL_TAG {
        return Some(Record::Entry {
            layer: tag as u16,
            block: field & BLOCK_MASK,
            entry: MapEntry::decode(b),
        });
    }
    let page = u64::from_le_bytes(b[0..8].try_into().expect("8 bytes"));
    let pool = u32::from_le_bytes(b[8..12].try_into().expect("4 bytes"));
    let table = u32::from_le_bytes(b[12..16].try_into().expect("4 bytes"));
    match (field >> 32) & 0xFFFF {
        OP_PRESERVE => Some(Record::Preserve { layer: field as u16, page, pool, table }),
        OP_OWN => Some(Record::Table(TableOp::Own {
            from: field as u16,
            to: (field >> 16) as u16,
            page,
            pool,
            table,
        })),
        OP_DROP => Some(Record::Table(TableOp::Drop { layer: field as u16, page, pool })),
        _ => None,
    }
}
