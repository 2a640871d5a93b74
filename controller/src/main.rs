//! `inplace-controller`: turns releases and rollouts into per-node plans.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "inplace-controller", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions, or write one file per CRD into a directory.
    Crds {
        /// Directory to write `<plural>.yaml` files into (default: print to stdout).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Crds { out } => write_crds(out),
    }
}

fn write_crds(out: Option<PathBuf>) -> anyhow::Result<()> {
    for (file_name, crd) in inplace_proto::crd::all() {
        let yaml = inplace_proto::crd::to_yaml(&crd);
        match &out {
            Some(dir) => {
                let path = dir.join(file_name);
                std::fs::write(&path, yaml)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            None => print!("---\n{yaml}"),
        }
    }
    Ok(())
}
