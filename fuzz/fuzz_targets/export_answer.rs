//! The Keras export process runs model code, which may write anything to
//! its stdout: any bytes, as its answer lines for one to three files, are
//! each taken or refused (ending the process) by the supervisor's checks;
//! never a panic, and never a job that was not given.

#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| common::bounded("export_answer", data, || run(data)));

fn run(data: &[u8]) {
    for jobs in 1..=3 {
        let answers = isorun_engine::keras::fuzz_export_answer(data, jobs);
        // Only the last line may be refused: a refused line ends the process.
        if let Some(position) = answers.iter().position(Result::is_err) {
            assert_eq!(position, answers.len() - 1);
        }
    }
}
