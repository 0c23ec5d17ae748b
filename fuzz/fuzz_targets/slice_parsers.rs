//! The slice protocol's header parsers (stria_slice::wire) and the slice header.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| stria_slice::fuzzing::parsers(data));
