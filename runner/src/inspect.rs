//! `isorun inspect` (not yet written).

use crate::cli::InspectArgs;

pub fn main(_args: &InspectArgs) -> Result<i32, String> {
    Err("isorun inspect: not implemented yet".into())
}
