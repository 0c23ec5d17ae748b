//! Bad arguments come back as typed errors, never panics, and leave outputs untouched.

use stria_ec::{Backend, Config, EcError, MAX_TOTAL_SHARDS, ReedSolomon};

#[test]
fn shapes_out_of_range_are_refused() {
    assert_eq!(ReedSolomon::new(0, 2).unwrap_err(), EcError::InvalidDataShards { data_shards: 0 });
    assert_eq!(ReedSolomon::new(4, 0).unwrap_err(), EcError::InvalidParityShards { parity_shards: 0 });
    assert!(matches!(ReedSolomon::new(200, 56), Err(EcError::TooManyShards { max: MAX_TOTAL_SHARDS, .. })));
    assert!(matches!(ReedSolomon::new(usize::MAX, usize::MAX), Err(EcError::TooManyShards { .. })));
    assert!(ReedSolomon::new(1, 254).is_ok() && ReedSolomon::new(254, 1).is_ok());
}

#[test]
fn unsupported_backend_is_refused() {
    for backend in Backend::ALL {
        let result = ReedSolomon::with_backend(2, 1, backend);
        if backend.is_supported() {
            assert_eq!(result.unwrap().backend(), backend);
        } else {
            assert_eq!(result.unwrap_err(), EcError::UnsupportedBackend { backend });
        }
    }
    assert!(Backend::is_supported(Backend::Scalar));
    assert_eq!(Backend::from_name(stria_ec::backend_name()), Some(Backend::detect()));
}

#[test]
fn encode_refuses_wrong_counts_and_lengths() {
    let rs = ReedSolomon::new(3, 2).unwrap();
    let (a, b, c) = ([1u8; 8], [2u8; 8], [3u8; 9]);
    let (mut p, mut q) = ([7u8; 8], [7u8; 8]);
    let err = rs.encode(&[&a, &b], &mut [&mut p, &mut q]).unwrap_err();
    assert!(matches!(err, EcError::WrongShardCount { expected: 3, actual: 2, .. }));
    let err = rs.encode(&[&a, &b, &a], &mut [&mut p]).unwrap_err();
    assert!(matches!(err, EcError::WrongShardCount { expected: 2, actual: 1, .. }));
    let err = rs.encode(&[&a, &b, &c], &mut [&mut p, &mut q]).unwrap_err();
    assert_eq!(err, EcError::ShardLengthMismatch { index: 2, expected_bytes: 8, actual_bytes: 9 });
    let mut short = [0u8; 7];
    let err = rs.encode(&[&a, &b, &a], &mut [&mut p, &mut short]).unwrap_err();
    assert_eq!(err, EcError::ShardLengthMismatch { index: 4, expected_bytes: 8, actual_bytes: 7 });
    assert_eq!((p, q), ([7u8; 8], [7u8; 8]), "outputs untouched on error");
}

#[test]
fn reconstruct_refuses_bad_requests() {
    let rs = ReedSolomon::new(3, 2).unwrap();
    let d = [5u8; 16];
    let mut out = [0u8; 16];
    let mut out2 = [0u8; 16];
    let three_lost = [Some(&d[..]), None, None, None, Some(&d[..])];
    let err = rs.reconstruct(&three_lost, &mut [(1, &mut out[..])]).unwrap_err();
    assert_eq!(err, EcError::TooManyErasures { missing: 3, parity_shards: 2 });
    let shards = [Some(&d[..]), None, Some(&d[..]), Some(&d[..]), None];
    assert!(matches!(rs.reconstruct(&shards[..4], &mut []), Err(EcError::WrongShardCount { .. })));
    let err = rs.reconstruct(&shards, &mut [(5, &mut out[..])]).unwrap_err();
    assert_eq!(err, EcError::ShardIndexOutOfRange { index: 5, shards: 5 });
    let err = rs.reconstruct(&shards, &mut [(0, &mut out[..])]).unwrap_err();
    assert_eq!(err, EcError::ShardNotMissing { index: 0 });
    let err = rs.reconstruct(&shards, &mut [(1, &mut out[..]), (1, &mut out2[..])]).unwrap_err();
    assert_eq!(err, EcError::DuplicateShard { index: 1 });
    let err = rs.reconstruct(&shards, &mut [(1, &mut out[..15])]).unwrap_err();
    assert!(matches!(err, EcError::ShardLengthMismatch { index: 1, .. }));
    let short = [5u8; 15];
    let uneven = [Some(&d[..]), None, Some(&short[..]), Some(&d[..]), None];
    let err = rs.reconstruct(&uneven, &mut [(1, &mut out[..])]).unwrap_err();
    assert!(matches!(err, EcError::ShardLengthMismatch { index: 2, .. }));
    assert_eq!(out, [0u8; 16]);
    rs.reconstruct(&shards, &mut []).unwrap();
}

#[test]
fn verify_and_update_refuse_bad_requests() {
    let rs = ReedSolomon::new(2, 2).unwrap();
    let d = [1u8; 4];
    assert!(matches!(rs.verify(&[&d, &d, &d]), Err(EcError::WrongShardCount { .. })));
    assert!(matches!(rs.verify(&[&d, &d, &d, &d[..3]]), Err(EcError::ShardLengthMismatch { index: 3, .. })));
    let (mut p, mut q) = ([0u8; 4], [0u8; 4]);
    let err = rs.update(2, &d, &d, &mut [&mut p, &mut q]).unwrap_err();
    assert_eq!(err, EcError::ShardIndexOutOfRange { index: 2, shards: 2 });
    assert!(matches!(
        rs.update(0, &d, &d[..3], &mut [&mut p, &mut q]),
        Err(EcError::ShardLengthMismatch { .. })
    ));
    assert!(matches!(rs.update_delta(0, &d, &mut [&mut p]), Err(EcError::WrongShardCount { .. })));
    let mut short = [0u8; 3];
    let err = rs.update_delta(1, &d, &mut [&mut p, &mut short]).unwrap_err();
    assert_eq!(err, EcError::ShardLengthMismatch { index: 3, expected_bytes: 4, actual_bytes: 3 });
}

#[test]
fn overlapping_buffers_are_refused() {
    // Safe code cannot make `&` and `&mut` overlap; build the overlap the way an unsafe caller
    // might have, from one buffer, and check the codec notices instead of computing garbage.
    let rs = ReedSolomon::with_config(2, 1, Config { backend: Some(Backend::Scalar), ..Config::default() })
        .unwrap();
    let mut buf = vec![0u8; 32];
    let ptr = buf.as_mut_ptr();
    // SAFETY: test-only aliasing to exercise the check; the codec must not read or write
    // through either slice before refusing.
    let data: &[u8] = unsafe { std::slice::from_raw_parts(ptr, 16) };
    // SAFETY: as above.
    let out: &mut [u8] = unsafe { std::slice::from_raw_parts_mut(ptr.wrapping_add(8), 16) };
    let other = [0u8; 16];
    let err = rs.encode(&[data, &other], &mut [out]).unwrap_err();
    assert!(matches!(err, EcError::OutputAliasesInput { output: 0, .. }));
    let msg = err.to_string();
    assert!(msg.contains("overlaps input 0"), "{msg}");
}
