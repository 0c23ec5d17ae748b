//! The iSCSI target's parsers: text keys, login negotiation, CDB sizing (stria_iscsi::fuzzing).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| stria_iscsi::fuzzing::parsers(data));
