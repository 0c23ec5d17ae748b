//! The `stria` command: CLI and daemon in one binary.
#![forbid(unsafe_code)]

fn main() {
    println!("stria");
}
