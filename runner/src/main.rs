//! The `isorun` binary: parse the command line, run, and turn the result
//! into an exit code (0 all ok, 1 some model failed, 2 usage error, 130/143
//! interrupted). The work is in the library.

use clap::Parser;

fn main() {
    // `run --config FILE` puts the file's settings on the command line first.
    let args = match isorun::config::expand_command_line(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("isorun: error: {}", with_causes(&e));
            std::process::exit(isorun_protocol::exit_code::USAGE);
        }
    };
    let cli = isorun::cli::Cli::parse_from(args);
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => tracing::Level::ERROR,
        (false, 0) => tracing::Level::WARN,
        (false, 1) => tracing::Level::INFO,
        (false, 2) => tracing::Level::DEBUG,
        (false, _) => tracing::Level::TRACE,
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .without_time()
        .init();
    let code = match isorun::run::main(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("isorun: error: {e}");
            isorun_protocol::exit_code::USAGE
        }
    };
    std::process::exit(code);
}

/// `error: cause: cause's cause`, one line.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        text.push_str(&format!(": {next}"));
        cause = next.source();
    }
    text
}
