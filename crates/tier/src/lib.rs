//! Tiered volumes: a mirrored write cache and metadata on fast drives in front of an erasure-coded capacity tier.
