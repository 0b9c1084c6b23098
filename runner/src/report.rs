//! Reports of a run (`--report`, `--junit`, `--html`) and `isorun report
//! diff|merge` (not yet written).

use crate::cli::ReportCommand;

pub fn main(_command: &ReportCommand) -> Result<i32, String> {
    Err("isorun report: not implemented yet".into())
}
