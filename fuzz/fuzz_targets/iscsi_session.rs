//! Bytes played as everything an initiator sends on one connection to the iSCSI target.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| stria_iscsi::fuzzing::session(data));
