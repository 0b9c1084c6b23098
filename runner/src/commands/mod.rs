//! One module per command; [`dispatch`] picks it. Commands share helpers
//! through `crate::support` only, never through each other; the one
//! exception, `rescore`, pairs with a baseline's predictions through eval's
//! own `eval::pair_through_predictions` (and parses its rules and baseline
//! with `crate::settings::eval`, as eval does) so that the two cannot differ.

mod cache;
mod doctor;
mod eval;
mod inspect;
mod ls;
mod man;
mod map;
mod pipe;
mod report;
mod rescore;
mod run;
mod slurm;

use crate::cli::{Cli, Command};
use crate::error::CliError;

/// Runs the command: its exit code, or why nothing (more) ran.
pub fn dispatch(cli: Cli) -> Result<i32, CliError> {
    let code = match cli.command {
        Command::Run(args) => run::main(*args, cli.quiet)?,
        Command::Eval(args) => eval::main(*args, cli.quiet)?,
        Command::Inspect(args) => inspect::main(&args)?,
        Command::Ls(args) => ls::main(&args)?,
        Command::Pipe(args) => pipe::main(&args)?,
        Command::Map(args) => map::main(*args, cli.quiet)?,
        Command::Doctor(args) => doctor::main(&args)?,
        Command::Cache(command) => cache::main(&command)?,
        Command::Rescore(args) => rescore::main(*args, cli.quiet)?,
        Command::Report(command) => report::main(&command)?,
        Command::Slurm(command) => slurm::main(&command)?,
        Command::Completions(args) => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(args.shell, &mut command, "isorun", &mut script);
            crate::support::print_stdout(&script)?
        }
        Command::Man(args) => man::main(&args)?,
    };
    Ok(code)
}
