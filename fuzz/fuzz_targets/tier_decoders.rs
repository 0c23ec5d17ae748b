//! A log-structured volume's decoders (map log and pages, summaries, segment, layer and index
//! tables, the volume header): never a panic, and what decodes round trips
//! (`stria_tier::fuzzing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = stria_tier::fuzzing::decoders(data);
});
