//! Why `isorun` ends without a command's own exit code, and which code that
//! is: one enum, so that the mapping from a failure to an exit code is
//! written once (as nextest's `ExpectedError::process_exit_code`). A
//! command's own outcomes (0 all ok, 1 some model not ok, 130/143
//! interrupted) are its `Ok` value; an `Err` here means nothing more ran.

use crate::config::ConfigError;
use crate::support::{print_error, with_causes};
use isorun_protocol::exit_code;

/// A command line or setting `isorun` cannot use.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// `--config FILE` cannot be read or holds a bad setting.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// What clap refuses, and `--help` and `--version`, which clap prints.
    #[error(transparent)]
    Clap(#[from] clap::Error),
    /// A flag's value, a file or a model that cannot be used, found before
    /// (more) work starts.
    #[error("{0}")]
    Usage(String),
}

impl From<String> for CliError {
    fn from(message: String) -> CliError {
        CliError::Usage(message)
    }
}

impl From<&str> for CliError {
    fn from(message: &str) -> CliError {
        CliError::Usage(message.to_string())
    }
}

impl CliError {
    /// The process's exit code: 2 (usage), or clap's own (0 for help and
    /// version, 2 for a refused command line).
    pub fn process_exit_code(&self) -> i32 {
        match self {
            CliError::Config(_) | CliError::Usage(_) => exit_code::USAGE,
            CliError::Clap(error) => error.exit_code(),
        }
    }

    /// Says it: `isorun: error: ...` on stderr, or as clap renders it (help
    /// and version on stdout).
    pub fn print(&self) {
        match self {
            CliError::Config(error) => print_error(with_causes(error)),
            CliError::Clap(error) => {
                let _ = error.print();
                let _ = std::io::Write::flush(&mut std::io::stdout());
            }
            CliError::Usage(message) => print_error(message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    #[test]
    fn usage_errors_exit_2_and_clap_keeps_its_own_codes() {
        assert_eq!(CliError::from("--jobs 0: expected at least 1").process_exit_code(), 2);
        let help = Cli::try_parse_from(["isorun", "--help"]).expect_err("help is clap's error kind");
        assert_eq!(CliError::from(help).process_exit_code(), 0);
        let version = Cli::try_parse_from(["isorun", "--version"]).expect_err("so is version");
        assert_eq!(CliError::from(version).process_exit_code(), 0);
        let bad = Cli::try_parse_from(["isorun", "eval", "m/", "--data", "d", "--label", "y", "--gate", "never"])
            .expect_err("--gate never");
        assert_eq!(CliError::from(bad).process_exit_code(), 2);
    }
}
