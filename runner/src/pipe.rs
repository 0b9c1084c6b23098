//! `isorun pipe` (not yet written).

use crate::cli::PipeArgs;

pub fn main(_args: &PipeArgs) -> Result<i32, String> {
    Err("isorun pipe: not implemented yet".into())
}
