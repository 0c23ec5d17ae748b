//! NBD (Network Block Device) protocol server for stria volumes.
