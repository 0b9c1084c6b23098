//! `isorun ls` (not yet written).

use crate::cli::LsArgs;

pub fn main(_args: &LsArgs) -> Result<i32, String> {
    Err("isorun ls: not implemented yet".into())
}
