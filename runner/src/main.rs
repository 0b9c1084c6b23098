//! The `isorun` binary: parse the command line, run the command, and turn
//! the result into an exit code (0 all ok, 1 some model failed, 2 usage
//! error, 130/143 interrupted). The work is in `isorun-engine`; the
//! commands in `commands/` wire flags to it.

mod cli;
mod commands;
mod config;
mod drive;
mod error;
mod output_lock;
mod printer;
mod settings;
mod size;
mod support;
mod warmup;

use clap::Parser;
use error::CliError;
use std::ffi::OsString;

fn main() {
    // The Keras export sandbox launcher: confine this process, exec Python.
    // First thing, while single-threaded (Landlock and seccomp bind threads).
    let mut raw = std::env::args_os();
    if raw.nth(1).is_some_and(|a| a == isorun_engine::keras::LAUNCH_ARG) {
        let spec = raw.next().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        eprintln!("{}", isorun_engine::keras::launch(&spec));
        std::process::exit(126);
    }
    // The same for `isorun map`'s zygote.
    let mut raw = std::env::args_os();
    if raw.nth(1).is_some_and(|a| a == isorun_map::launch::LAUNCH_ARG) {
        let spec = raw.next().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        eprintln!("{}", isorun_map::launch::launch(&spec));
        std::process::exit(126);
    }
    quiet_broken_pipe();
    let code = match run(std::env::args_os().collect()) {
        Ok(code) => code,
        Err(error) => {
            error.print();
            error.process_exit_code()
        }
    };
    std::process::exit(code);
}

/// Parses the command line and runs the command; its exit code, or why
/// nothing (more) ran.
fn run(raw: Vec<OsString>) -> Result<i32, CliError> {
    // `run --config FILE` puts the file's settings on the command line first.
    let args = config::expand_command_line(raw)?;
    // Help, version and every other refusal as clap renders them, but one of
    // `run`'s flags given to `eval`, which clap would call a model path.
    let cli = cli::Cli::try_parse_from(&args).map_err(|e| {
        match cli::run_flag_given_to_eval(&e, &args, &<cli::Cli as clap::CommandFactory>::command()) {
            Some(message) => CliError::Usage(message),
            None => CliError::Clap(e),
        }
    })?;
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => tracing::Level::ERROR,
        (false, 0) => tracing::Level::WARN,
        (false, 1) => tracing::Level::INFO,
        (false, 2) => tracing::Level::DEBUG,
        (false, _) => tracing::Level::TRACE,
    };
    use std::io::IsTerminal;
    let colours = support::stderr_colours(std::io::stderr().is_terminal(), |name| std::env::var(name).ok());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colours)
        .with_max_level(level)
        .with_target(false)
        .without_time()
        .init();
    commands::dispatch(cli)
}

/// A `println!` whose reader went away (`isorun cache ls | head -1`)
/// panics; that is a normal end for a tool in a pipeline: exit 0 with no
/// message, as the commands that write through `support::print_stdout` do.
fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(isorun_protocol::exit_code::OK);
        }
        default(info);
    }));
}
