//! Reconstruction: every erasure pattern up to 8+4 on every engine, random patterns up to 16+4,
//! only the wanted shards written, cached and uncached paths agreeing.

use crate::common::{Rng, Shards, encode, fast_backends, subsets_up_to};
use stria_ec::{Backend, ReedSolomon};

/// Erases `lost` from a stripe of `data` + `parity`, rebuilds them all and checks them.
fn check_pattern(rs: &ReedSolomon, stripe: &[&[u8]], lost: &[usize], len: usize, cached: bool) {
    let shards: Vec<Option<&[u8]>> =
        stripe.iter().enumerate().map(|(i, s)| (!lost.contains(&i)).then_some(*s)).collect();
    let mut out = Shards::new(lost.len(), len, 7);
    {
        let mut bufs = out.all_mut();
        let mut wanted: Vec<(usize, &mut [u8])> = lost.iter().copied().zip(bufs.drain(..)).collect();
        if cached {
            rs.reconstruct(&shards, &mut wanted).unwrap();
        } else {
            rs.reconstruct_uncached(&shards, &mut wanted).unwrap();
        }
    }
    for (i, &l) in lost.iter().enumerate() {
        assert_eq!(out.get(i), stripe[l], "{} {lost:?} shard {l} len {len}", rs.backend());
    }
}

#[test]
fn every_erasure_pattern_up_to_8_plus_4_on_every_engine() {
    let mut rng = Rng::new(0xdec0_0001);
    let mut backends = fast_backends();
    backends.push(Backend::Naive);
    for k in 1..=8 {
        for m in 1..=4 {
            let len = 64 * 3 + 1 + k;
            let data = Shards::random(k, len, 1, &mut rng);
            let parity = encode(&ReedSolomon::new(k, m).unwrap(), &data, len, 2);
            let mut stripe = data.all();
            stripe.extend(parity.all());
            let patterns = subsets_up_to(k + m, m);
            for &backend in &backends {
                let rs = ReedSolomon::with_backend(k, m, backend).unwrap();
                for (p, lost) in patterns.iter().enumerate() {
                    check_pattern(&rs, &stripe, lost, len, p % 5 != 0);
                }
            }
        }
    }
}

#[test]
fn random_erasure_patterns_up_to_16_plus_4() {
    let mut rng = Rng::new(0xdec0_0002);
    for k in 9..=16 {
        for m in 1..=4 {
            for len in [1, 63, 130, 4096 + 3] {
                let data = Shards::random(k, len, rng.below(64), &mut rng);
                let parity = encode(&ReedSolomon::new(k, m).unwrap(), &data, len, 0);
                let mut stripe = data.all();
                stripe.extend(parity.all());
                for backend in fast_backends() {
                    let rs = ReedSolomon::with_backend(k, m, backend).unwrap();
                    for _ in 0..6 {
                        let mut lost: Vec<usize> = Vec::new();
                        let count = 1 + rng.below(m);
                        while lost.len() < count {
                            let i = rng.below(k + m);
                            if !lost.contains(&i) {
                                lost.push(i);
                            }
                        }
                        check_pattern(&rs, &stripe, &lost, len, true);
                    }
                }
            }
        }
    }
}

#[test]
fn only_the_wanted_shards_are_written() {
    let mut rng = Rng::new(0xdec0_0003);
    let (k, m, len) = (6, 3, 200);
    let data = Shards::random(k, len, 0, &mut rng);
    let rs = ReedSolomon::new(k, m).unwrap();
    let parity = encode(&rs, &data, len, 0);
    let mut stripe: Vec<Option<&[u8]>> = data.all().into_iter().map(Some).collect();
    stripe.extend(parity.all().into_iter().map(Some));
    // Lose data 1, data 4 and parity 2; ask for data 4 only, in a buffer surrounded by guards.
    for i in [1, 4, k + 2] {
        stripe[i] = None;
    }
    let mut buf = vec![0xeeu8; len + 2];
    rs.reconstruct(&stripe, &mut [(4, &mut buf[1..=len])]).unwrap();
    assert_eq!(&buf[1..=len], data.get(4));
    assert_eq!((buf[0], buf[len + 1]), (0xee, 0xee));
    // Then parity 2 and data 1, in that order.
    let (mut p2, mut d1) = (vec![0u8; len], vec![0u8; len]);
    rs.reconstruct(&stripe, &mut [(k + 2, &mut p2[..]), (1, &mut d1[..])]).unwrap();
    assert_eq!((&p2[..], &d1[..]), (parity.get(2), data.get(1)));
}

#[test]
fn big_shards_rebuild_on_every_engine() {
    let mut rng = Rng::new(0xdec0_0004);
    for (k, m, len) in [(8, 2, 4 << 20), (10, 4, (1 << 20) + 13)] {
        let data = Shards::random(k, len, 5, &mut rng);
        let parity = encode(&ReedSolomon::with_backend(k, m, Backend::Naive).unwrap(), &data, len, 0);
        let mut stripe = data.all();
        stripe.extend(parity.all());
        let lost: Vec<usize> = (0..m).map(|i| i * 3).collect();
        for backend in fast_backends() {
            let rs = ReedSolomon::with_backend(k, m, backend).unwrap();
            // Aligned outputs take the non-temporal store path, misaligned ones the plain one.
            assert_eq!(encode(&rs, &data, len, 0).to_vecs(), parity.to_vecs(), "{backend} aligned");
            assert_eq!(encode(&rs, &data, len, 9).to_vecs(), parity.to_vecs(), "{backend} misaligned");
            check_pattern(&rs, &stripe, &lost, len, true);
            assert!(rs.verify(&stripe).unwrap());
        }
    }
}
