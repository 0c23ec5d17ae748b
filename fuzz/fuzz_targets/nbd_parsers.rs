//! Option, request and extent parsers: pure functions over bytes, with their invariants asserted.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    stria_nbd::fuzzing::parsers(data);
});
