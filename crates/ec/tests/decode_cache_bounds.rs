//! The decode-plan cache stays within its bound, gives the same answers as no cache, and is
//! shared safely between threads.

use std::sync::Arc;

use crate::common::{Rng, Shards, encode, subsets_up_to};
use stria_ec::{Config, DEFAULT_DECODE_CACHE_ENTRIES, ReedSolomon};

fn rebuild(rs: &ReedSolomon, stripe: &[&[u8]], lost: &[usize]) -> Vec<Vec<u8>> {
    let shards: Vec<Option<&[u8]>> =
        stripe.iter().enumerate().map(|(i, s)| (!lost.contains(&i)).then_some(*s)).collect();
    let mut out = vec![vec![0u8; stripe[0].len()]; lost.len()];
    let mut wanted: Vec<(usize, &mut [u8])> =
        lost.iter().copied().zip(out.iter_mut().map(|v| &mut v[..])).collect();
    rs.reconstruct(&shards, &mut wanted).unwrap();
    out
}

#[test]
fn cache_never_exceeds_its_bound() {
    let mut rng = Rng::new(0xcac4_0001);
    let (k, m, len) = (6, 3, 100);
    let config = Config { decode_cache_entries: 5, ..Config::default() };
    let rs = ReedSolomon::with_config(k, m, config).unwrap();
    assert_eq!(ReedSolomon::new(k, m).unwrap().decode_cache_entries(), DEFAULT_DECODE_CACHE_ENTRIES);
    let data = Shards::random(k, len, 0, &mut rng);
    let parity = encode(&rs, &data, len, 0);
    let mut stripe = data.all();
    stripe.extend(parity.all());
    for round in 0..2 {
        for lost in subsets_up_to(k + m, m).iter().filter(|l| !l.is_empty()) {
            let out = rebuild(&rs, &stripe, lost);
            for (o, &l) in out.iter().zip(lost) {
                assert_eq!(&o[..], stripe[l], "round {round} {lost:?}");
            }
            assert!(rs.decode_cache_len() <= 5);
        }
    }
    assert_eq!(rs.decode_cache_len(), 5);
}

#[test]
fn disabled_cache_still_reconstructs() {
    let mut rng = Rng::new(0xcac4_0002);
    let rs = ReedSolomon::with_config(4, 2, Config { decode_cache_entries: 0, ..Config::default() }).unwrap();
    let data = Shards::random(4, 77, 0, &mut rng);
    let parity = encode(&rs, &data, 77, 0);
    let mut stripe = data.all();
    stripe.extend(parity.all());
    assert_eq!(rebuild(&rs, &stripe, &[0, 5]), vec![stripe[0].to_vec(), stripe[5].to_vec()]);
    assert_eq!(rs.decode_cache_len(), 0);
}

#[test]
fn threads_share_one_codec() {
    let mut rng = Rng::new(0xcac4_0003);
    let (k, m, len) = (8, 4, 1000);
    let rs = Arc::new(
        ReedSolomon::with_config(k, m, Config { decode_cache_entries: 8, ..Config::default() }).unwrap(),
    );
    let data = Shards::random(k, len, 0, &mut rng);
    let parity = encode(&rs, &data, len, 0);
    let stripe: Vec<Vec<u8>> = data.to_vecs().into_iter().chain(parity.to_vecs()).collect();
    let stripe = Arc::new(stripe);
    let handles: Vec<_> = (0..4u64)
        .map(|t| {
            let (rs, stripe) = (Arc::clone(&rs), Arc::clone(&stripe));
            std::thread::spawn(move || {
                let mut rng = Rng::new(t);
                let refs: Vec<&[u8]> = stripe.iter().map(Vec::as_slice).collect();
                for _ in 0..200 {
                    let lost = vec![rng.below(k + m)];
                    let mut lost = lost;
                    let second = rng.below(k + m);
                    if !lost.contains(&second) {
                        lost.push(second);
                    }
                    let out = rebuild(&rs, &refs, &lost);
                    for (o, &l) in out.iter().zip(&lost) {
                        assert_eq!(o, &stripe[l]);
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(rs.decode_cache_len() <= 8);
}

#[test]
fn two_codecs_do_not_share_plans() {
    // Same erasure pattern, different shapes: the per-thread fast path must tell them apart.
    let mut rng = Rng::new(0xcac4_0004);
    for (k, m) in [(4, 2), (4, 3), (4, 2)] {
        let rs = ReedSolomon::new(k, m).unwrap();
        let data = Shards::random(k, 64, 0, &mut rng);
        let parity = encode(&rs, &data, 64, 0);
        let mut stripe = data.all();
        stripe.extend(parity.all());
        assert_eq!(rebuild(&rs, &stripe, &[0, 1]), vec![stripe[0].to_vec(), stripe[1].to_vec()]);
    }
}
