//! `isorun-worker --in-process [--batch N] [--signature KEY] [--repeat N]
//! MODEL...`: loads and runs every model one after another in this one
//! process, with zero inputs shaped from each signature (unknown dimensions
//! become N, default 1), and prints one line per model and the total. It is
//! the floor that `scripts/bench` measures isolation against: the same C API
//! calls, no process per model, and none of isorun's guarantees. With
//! `--repeat N` each model's signature then runs N more times on the same
//! inputs, and a `repeat` line gives those N runs' total and the first one's
//! time: the floor for `isorun pipe`'s requests per second (the same calls,
//! no IPC).

use crate::tf::SavedModel;
use crate::warm::{with_dense_bytes, zero_inputs};
use isorun_protocol::SessionConfig;
use std::path::Path;
use std::time::Instant;

pub fn main(args: &[String]) -> i32 {
    let mut batch = 1u64;
    let mut signature = "serving_default".to_string();
    let mut repeat = 0u64;
    let mut models = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--batch" => batch = rest.next().and_then(|n| n.parse().ok()).unwrap_or(1),
            "--signature" => signature = rest.next().cloned().unwrap_or_default(),
            "--repeat" => repeat = rest.next().and_then(|n| n.parse().ok()).unwrap_or(0),
            model => models.push(model.to_string()),
        }
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let config = SessionConfig {
        intra_op_threads: cpus,
        inter_op_threads: cpus,
        gpu_allow_growth: true,
        gpu_memory_fraction: None,
    };
    let started = Instant::now();
    for model_dir in &models {
        let unit = Instant::now();
        let model = match SavedModel::load(Path::new(model_dir), &["serve".to_string()], &config) {
            Ok(model) => model,
            Err(e) => {
                eprintln!("{model_dir}: {e}");
                return 1;
            }
        };
        let loaded = unit.elapsed();
        let tensors = match model.signature(&signature) {
            Ok((info, _)) => zero_inputs(&info, batch),
            Err(e) => {
                eprintln!("{model_dir}: {e}");
                return 1;
            }
        };
        let inputs = with_dense_bytes(&tensors);
        if let Err(e) = model.run(&signature, &inputs) {
            eprintln!("{model_dir}: {e}");
            return 1;
        }
        println!(
            "{model_dir}\tload {:.1} ms\ttotal {:.1} ms",
            loaded.as_secs_f64() * 1e3,
            unit.elapsed().as_secs_f64() * 1e3
        );
        if repeat > 0 {
            let runs = Instant::now();
            let mut first = None;
            for _ in 0..repeat {
                let one = Instant::now();
                if let Err(e) = model.run(&signature, &inputs) {
                    eprintln!("{model_dir}: {e}");
                    return 1;
                }
                first.get_or_insert(one.elapsed());
            }
            println!(
                "{model_dir}\trepeat {repeat} runs\t{:.3} s\tfirst {:.3} ms",
                runs.elapsed().as_secs_f64(),
                first.unwrap_or_default().as_secs_f64() * 1e3
            );
        }
    }
    println!("total\t{:.3} s\t{} models", started.elapsed().as_secs_f64(), models.len());
    0
}
