//! stria's block engine: pools, superblocks, metadata, volume layouts, checksums, journal, rebuild and scrub.
