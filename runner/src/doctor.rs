//! `isorun doctor` (not yet written).

use crate::cli::DoctorArgs;

pub fn main(_args: &DoctorArgs) -> Result<i32, String> {
    Err("isorun doctor: not implemented yet".into())
}
