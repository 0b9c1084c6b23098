//! One module per command; [`dispatch`] picks it. Commands share helpers
//! through `crate::support` only, never through each other.

mod cache;
mod doctor;
mod eval;
mod inspect;
mod ls;
mod pipe;
mod report;
mod run;
mod slurm;

use crate::cli::{Cli, Command};
use isorun_protocol::exit_code;

/// Runs the command; `Err` is a usage error (exit 2).
pub fn dispatch(cli: Cli) -> Result<i32, String> {
    match cli.command {
        Command::Run(args) => run::main(*args, cli.quiet),
        Command::Eval(args) => eval::main(*args, cli.quiet),
        Command::Inspect(args) => inspect::main(&args),
        Command::Ls(args) => ls::main(&args),
        Command::Pipe(args) => pipe::main(&args),
        Command::Doctor(args) => doctor::main(&args),
        Command::Cache(command) => cache::main(&command),
        Command::Report(command) => report::main(&command),
        Command::Slurm(command) => slurm::main(&command),
        Command::Completions(args) => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(args.shell, &mut command, "isorun", &mut std::io::stdout());
            Ok(exit_code::OK)
        }
        Command::Man => {
            let command = <Cli as clap::CommandFactory>::command();
            clap_mangen::Man::new(command).render(&mut std::io::stdout()).map_err(|e| e.to_string())?;
            Ok(exit_code::OK)
        }
    }
}
