//! Every engine's parity equals the reference engine's, for every shape up to 16+4, at odd and
//! unaligned lengths.

use crate::common::{Rng, Shards, encode, fast_backends};
use stria_ec::{Backend, ReedSolomon};

const LENGTHS: [usize; 14] = [1, 2, 15, 16, 31, 33, 63, 64, 65, 127, 129, 259, 1000, 4096 + 17];

#[test]
fn every_engine_matches_the_reference_for_every_shape_up_to_16_plus_4() {
    let mut rng = Rng::new(0x5eed_0001);
    for k in 1..=16 {
        for m in 1..=4 {
            let reference = ReedSolomon::with_backend(k, m, Backend::Naive).unwrap();
            let engines: Vec<_> =
                fast_backends().into_iter().map(|b| ReedSolomon::with_backend(k, m, b).unwrap()).collect();
            for (i, &len) in LENGTHS.iter().enumerate() {
                let misalign = i % 7 * 9;
                let data = Shards::random(k, len, misalign, &mut rng);
                let expected = encode(&reference, &data, len, 0).to_vecs();
                for rs in &engines {
                    let got = encode(rs, &data, len, (misalign + 5) % 64).to_vecs();
                    assert_eq!(got, expected, "{} {k}+{m} len {len}", rs.backend());
                }
            }
        }
    }
}

#[test]
fn large_shapes_and_many_parity_rows_match_the_reference() {
    // More parity rows than a register group (8 on AVX-512, 4 on AVX2), and the 255 limit.
    let mut rng = Rng::new(0x5eed_0002);
    for (k, m, len) in [(4, 9, 300), (20, 12, 200), (3, 17, 130), (128, 127, 70), (1, 254, 65), (254, 1, 129)]
    {
        let reference = ReedSolomon::with_backend(k, m, Backend::Naive).unwrap();
        let data = Shards::random(k, len, 3, &mut rng);
        let expected = encode(&reference, &data, len, 0).to_vecs();
        for backend in fast_backends() {
            let rs = ReedSolomon::with_backend(k, m, backend).unwrap();
            assert_eq!(encode(&rs, &data, len, 11).to_vecs(), expected, "{backend} {k}+{m}");
        }
    }
}

#[test]
fn parity_zero_is_the_xor_of_the_data() {
    let mut rng = Rng::new(0x5eed_0003);
    let (k, len) = (6, 333);
    let data = Shards::random(k, len, 1, &mut rng);
    let mut xor = vec![0u8; len];
    for d in data.all() {
        xor.iter_mut().zip(d).for_each(|(x, &b)| *x ^= b);
    }
    for m in [1, 2, 3] {
        let rs = ReedSolomon::new(k, m).unwrap();
        assert_eq!(encode(&rs, &data, len, 0).get(0), &xor[..]);
    }
}

#[test]
fn encode_of_zero_length_shards_is_a_no_op() {
    let rs = ReedSolomon::new(3, 2).unwrap();
    let data: [&[u8]; 3] = [&[], &[], &[]];
    let mut parity: [&mut [u8]; 2] = [&mut [], &mut []];
    rs.encode(&data, &mut parity).unwrap();
    assert!(rs.verify(&[&[], &[], &[], &[], &[]]).unwrap());
}
