//! Every integration test of the device layer, in one test binary: each scenario file is a module
//! (one link of the dependency graph instead of one per file).

mod fault_device;
mod file_device;
mod thread_ring;
