//! Bytes played as everything a coordinator sends on one connection to a slice server.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| stria_slice::fuzzing::session(data));
