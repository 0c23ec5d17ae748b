//! The drive format's decoders (superblock, flush record, pool metadata, journal, checksum and
//! intent pages): never a panic, and what decodes round trips (`stria_engine::fuzzing`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = stria_engine::fuzzing::decoders(data);
});
