//! `stria-report`: turns the JSON a stria benchmark wrote into `REPORT.md` and PNG plots in one
//! folder (docs/benchmarks.md, "Reports").
//!
//! * `nbd FILE.json` (from `scripts/bench-nbd.sh`): IOPS and mean/p99 latency against queue
//!   depth, stria's volumes and nbdkit on the same axes, latency CDFs, ratio tables;
//! * `tier FILE.json` (from `stria-bench-tier --json`): write amplification per phase and over
//!   time, throughput and latency per phase;
//! * `rocksdb FILE.json` (from `scripts/bench-rocksdb.sh`): db_bench ops/s per workload and
//!   volume against a local file, latency CDFs;
//! * `ec FILE.json` (from `stria-bench-ec --json`): erasure-code GB/s per operation and stripe
//!   geometry, stria's kernel against ISA-L and the memory references, ratio tables;
//! * `engine FILE.json` (from `stria-bench-engine --json`): IOPS and bandwidth per layout against
//!   raw memory drives, healthy and degraded, ratio tables, drive write amplification;
//! * `fio FILE.json...` (fio's own `--output-format=json`): latency CDFs and a table.

#![forbid(unsafe_code)]

mod ec;
mod engine;
mod fio;
mod md;
mod nbd;
mod plot;
mod rocksdb;
#[cfg(test)]
mod testutil;
mod tier;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "stria-report", about = "REPORT.md and PNG plots from a stria benchmark's JSON")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// `scripts/bench-nbd.sh --out FILE.json`: stria against nbdkit through fio.
    Nbd(Args),
    /// `stria-bench-tier --json > FILE.json`: tiered volumes (write amplification, latency).
    Tier(Args),
    /// `scripts/bench-rocksdb.sh`: db_bench on ext4 over stria volumes and a local file.
    Rocksdb(Args),
    /// `stria-bench-ec --json > FILE.json`: erasure coding against ISA-L and memory limits.
    Ec(Args),
    /// `stria-bench-engine --json > FILE.json`: layouts against raw memory drives.
    Engine(Args),
    /// One or more outputs of `fio --output-format=json`: latency CDFs, IOPS, bandwidth.
    Fio(FioArgs),
}

#[derive(Debug, clap::Args)]
struct Args {
    /// The benchmark's JSON file.
    file: PathBuf,
    /// Folder for REPORT.md and the PNGs (created; files of the same names are replaced).
    /// Default: the JSON file's folder.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct FioArgs {
    /// fio JSON outputs; each is one line per job in the plots, named after the file.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Folder for REPORT.md and the PNGs (created). Default: the first file's folder.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn out_dir(out: Option<&PathBuf>, file: &Path) -> Result<PathBuf> {
    let dir = match out {
        Some(d) => d.clone(),
        None => file.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse_json(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Parses JSON that may follow other text (fio prints notes before its JSON).
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    let start = text.find(['{', '[']).context("no JSON object or array in the input")?;
    Ok(serde_json::from_str(&text[start..])?)
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let (dir, written) = match &cli.command {
        Command::Nbd(a) => {
            let dir = out_dir(a.out.as_ref(), &a.file)?;
            (dir.clone(), nbd::report(&read_json(&a.file)?, &dir)?)
        }
        Command::Tier(a) => {
            let dir = out_dir(a.out.as_ref(), &a.file)?;
            (dir.clone(), tier::report(&read_json::<Vec<tier::TierPhase>>(&a.file)?, &dir)?)
        }
        Command::Rocksdb(a) => {
            let dir = out_dir(a.out.as_ref(), &a.file)?;
            (dir.clone(), rocksdb::report(&read_json(&a.file)?, &dir)?)
        }
        Command::Ec(a) => {
            let dir = out_dir(a.out.as_ref(), &a.file)?;
            (dir.clone(), ec::report(&read_json::<Vec<ec::EcCell>>(&a.file)?, &dir)?)
        }
        Command::Engine(a) => {
            let dir = out_dir(a.out.as_ref(), &a.file)?;
            let run = engine::EngineRun::new(read_json(&a.file)?);
            (dir.clone(), engine::report(&run, &dir)?)
        }
        Command::Fio(a) => {
            let dir = out_dir(a.out.as_ref(), &a.files[0])?;
            let runs = a.files.iter().map(|f| fio::Labeled::read(f)).collect::<Result<Vec<_>>>()?;
            (dir.clone(), fio::report(&runs, &dir)?)
        }
    };
    for f in written {
        println!("{}", dir.join(f).display());
    }
    Ok(())
}
