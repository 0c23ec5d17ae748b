//! A whole client byte stream (handshake and transmission) against a real server connection.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = stria_nbd::fuzzing::session(data);
});
