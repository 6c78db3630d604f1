//! `ddprun`: torchrun-compatible launcher (see `g4ft_ddp::launcher`).
//!
//! `ddprun --standalone --nproc-per-node 2 -- ./my-trainer --config x.toml`

use clap::Parser;
use g4ft_ddp::launcher::{run, Args};

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("ddprun: {e}");
            std::process::exit(1);
        }
    }
}
