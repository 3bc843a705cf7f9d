//! The `branchbox` command line: a thin layer over `branchbox-core`.

mod args;
mod commands;
mod output;
mod remote;

use args::Cli;
use clap::Parser;

fn main() {
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
