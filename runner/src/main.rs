//! The `isorun` binary: parse the command line, run, and turn the result
//! into an exit code (0 all ok, 1 some model failed, 2 usage error, 130/143
//! interrupted). The work is in the library.

use clap::Parser;

fn main() {
    let cli = isorun::cli::Cli::parse();
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
