//! The `branchbox` command line: a thin layer over `branchbox-core`.

mod args;
mod bench;
mod challenge;
mod commands;
mod download;
mod files;
mod guest;
mod image;
mod network;
mod output;
mod pool;
mod remote;
mod remote_snapshots;
mod store;
mod template;
mod vm;

use args::Cli;
use clap::Parser;

fn main() {
    // Data directories, databases, checkpoint images and downloads hold sandboxes' memory,
    // files and secrets: nothing this command creates is for other users.
    // SAFETY: umask has no preconditions.
    unsafe { libc::umask(0o077) };
    let cli = Cli::parse();
    let json = cli.json;
    match commands::run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            output::error(json, &e);
            std::process::exit(1);
        }
    }
}
