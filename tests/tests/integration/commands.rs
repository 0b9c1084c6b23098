//! Tests of `isorun inspect`, `isorun ls` and `isorun doctor` (to be written).
