//! A pool drive is a volume's member (volume/member.rs).

use stria_dev::{BlockDevice, DevError, IoBuf, IoBytes};

use super::csum::Entry;
use super::journal::{AppendError, JournalPiece};
use super::{Drive, ReadFault};
use crate::volume::member::MemberDrive;

impl<D: BlockDevice> MemberDrive for Drive<D> {
    async fn read_verified(&self, block: u64, buf: IoBuf) -> Result<IoBuf, ReadFault> {
        Drive::read_verified(self, block, buf).await
    }

    async fn read_verified_crcs<'a>(
        &'a self,
        block: u64,
        buf: IoBuf,
        crcs: &'a mut [u32],
    ) -> Result<IoBuf, ReadFault> {
        Drive::read_verified_inner(self, block, buf, Some(crcs)).await
    }

    async fn read_isolating(&self, block: u64, blocks: u64) -> Option<(IoBuf, Vec<bool>, bool)> {
        Drive::read_isolating(self, block, blocks).await
    }

    async fn read_raw(&self, block: u64, buf: IoBuf) -> Result<IoBuf, DevError> {
        Drive::read_raw(self, block, buf).await
    }

    async fn write(&self, block: u64, data: IoBytes, fua: bool) -> Result<(), DevError> {
        Drive::write(self, block, data, fua).await
    }

    async fn write_carrying<'a>(
        &'a self,
        block: u64,
        data: IoBytes,
        fua: bool,
        crcs: &'a [u32],
    ) -> Result<(), DevError> {
        Drive::write_inner(self, block, data, fua, Some(crcs)).await
    }

    async fn zero(&self, block: u64, blocks: u64) -> Result<(), DevError> {
        Drive::zero(self, block, blocks).await
    }

    async fn is_unwritten(&self, block: u64, blocks: u64) -> bool {
        Drive::is_unwritten(self, block, blocks).await
    }

    async fn csum_entries(&self, block: u64, blocks: u64) -> Result<Vec<Entry>, DevError> {
        Drive::csum_entries(self, block, blocks).await
    }

    async fn bless<'a>(&'a self, block: u64, data: &'a [u8], written: &'a [bool]) -> Result<(), DevError> {
        Drive::bless(self, block, data, written).await
    }

    async fn journal_append(&self, piece: JournalPiece) -> Result<u64, AppendError> {
        Drive::journal_append(self, piece).await
    }

    fn record_repairs(&self, blocks: u64) {
        Drive::record_repairs(self, blocks);
    }
}
