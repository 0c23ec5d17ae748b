//! Incremental parity updates equal a full re-encode, on every engine, for whole shards and for
//! byte ranges inside them.

use crate::common::{Rng, Shards, encode, fast_backends};
use stria_ec::{Backend, ReedSolomon};

#[test]
fn update_equals_re_encode_on_every_engine() {
    let mut rng = Rng::new(0x0bda_0001);
    let mut backends = fast_backends();
    backends.push(Backend::Naive);
    for (k, m) in [(1, 1), (4, 2), (8, 3), (10, 4), (16, 4), (5, 11)] {
        for len in [1, 33, 64, 200, 4096 + 9] {
            let data = Shards::random(k, len, 3, &mut rng);
            for &backend in &backends {
                let rs = ReedSolomon::with_backend(k, m, backend).unwrap();
                let index = rng.below(k);
                let mut new = vec![0u8; len];
                rng.fill(&mut new);
                let mut parity = encode(&rs, &data, len, 1);
                rs.update(index, data.get(index), &new, &mut parity.all_mut()).unwrap();

                let mut changed = Shards::new(k, len, 0);
                for d in 0..k {
                    changed.get_mut(d).copy_from_slice(if d == index { &new } else { data.get(d) });
                }
                let expected = encode(&rs, &changed, len, 0).to_vecs();
                assert_eq!(parity.to_vecs(), expected, "{backend} {k}+{m} len {len}");

                // The delta form, back again: the parity returns to the original data's.
                let delta: Vec<u8> = new.iter().zip(data.get(index)).map(|(a, b)| a ^ b).collect();
                rs.update_delta(index, &delta, &mut parity.all_mut()).unwrap();
                assert_eq!(parity.to_vecs(), encode(&rs, &data, len, 0).to_vecs());
            }
        }
    }
}

#[test]
fn update_of_a_byte_range_inside_the_shard() {
    let mut rng = Rng::new(0x0bda_0002);
    let (k, m, len) = (6, 3, 8192);
    let data = Shards::random(k, len, 0, &mut rng);
    let rs = ReedSolomon::new(k, m).unwrap();
    let mut parity = encode(&rs, &data, len, 0);
    // Overwrite bytes 1000..3001 of data shard 2.
    let range = 1000..3001;
    let mut new = data.get(2).to_vec();
    rng.fill(&mut new[range.clone()]);
    {
        let mut parity_ranges: Vec<&mut [u8]> =
            parity.all_mut().into_iter().map(|p| &mut p[range.clone()]).collect();
        rs.update(2, &data.get(2)[range.clone()], &new[range.clone()], &mut parity_ranges).unwrap();
    }
    let mut stripe = data.all();
    stripe[2] = &new;
    stripe.extend(parity.all());
    assert!(rs.verify(&stripe).unwrap());
}
