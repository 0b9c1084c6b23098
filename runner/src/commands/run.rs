//! `isorun run`: validate everything that can be checked before work starts
//! (a problem there is a usage error, exit 2, and nothing is written), then
//! run every model and print one JSON line per model in the order the
//! models were found, each as soon as the ones before it are done.

use crate::cli::RunArgs;
use crate::drive::{discover_models, execute, Plan, Work};
use crate::error::CliError;
use crate::settings::{report_settings, run_settings};
use crate::support::with_causes;
use crate::warmup::WarmupFeed;
use isorun_engine::{signature_here, Model, ModelFormat, PreparedInputs, Settings};
use isorun_protocol::TensorSpec;
use isorun_tensors::inputs::load_inputs;
use std::time::Instant;

/// Runs the command; `Err` is a usage error (exit 2).
pub fn main(args: RunArgs, quiet: bool) -> Result<i32, CliError> {
    let started = Instant::now();
    let started_at = std::time::SystemTime::now();
    let run_settings = run_settings(&args)?;
    let settings = &run_settings.engine;
    let models = discover_models(&args)?;
    if args.given.warmup_inputs {
        return warmup(&args, quiet, started, started_at, &run_settings, models);
    }
    let inputs = load_inputs(&args.given.input, &args.given.inputs).map_err(|e| with_causes(&e))?;
    if let Some(dir) = &run_settings.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("--output-dir {}: cannot create: {e}", dir.display()))?;
    }
    if let Some(dir) = args.given.inputs_dir.as_ref().filter(|d| !d.is_dir()) {
        return Err(format!("--inputs-dir {}: not a folder", dir.display()).into());
    }
    let inputs = PreparedInputs::new(inputs, args.given.inputs_dir.clone());
    if inputs.is_empty() {
        refuse_missing_inputs(&models, settings)?;
    }
    let sinks = run_settings.sinks();
    let tolerances = run_settings.expect.as_ref().map(|e| (e.rtol, e.atol));
    let key_settings = format!(
        "{}\0{:?}\0{:?}\0{:?}\0{:?}",
        settings.signature, settings.tags, settings.batch_size, settings.libraries, tolerances
    ) + if settings.strict_dtypes { "\0strict_dtypes" } else { "" };
    let plan = Plan {
        run: &run_settings,
        quiet,
        started,
        started_at,
        engine: settings.clone(),
        models,
        work: Work::Inputs { inputs: &inputs, sinks: &sinks },
        // Hashing every input byte is for journal keys only.
        key_inputs: if run_settings.journal.is_some() { inputs.digest() } else { Vec::new() },
        key_settings,
        inputs_dir: args.given.inputs_dir.clone(),
        expect_dir: run_settings.expect.as_ref().map(|e| e.dir.clone()),
        report_settings: report_settings(&args, &run_settings),
    };
    execute(plan)
}

/// `--warmup-inputs`: each model fed its own TF Serving warm-up requests
/// (`crate::warmup`), checked against its signatures before any worker.
fn warmup(
    args: &RunArgs,
    quiet: bool,
    started: Instant,
    started_at: std::time::SystemTime,
    run_settings: &crate::settings::RunSettings,
    models: Vec<Model>,
) -> Result<i32, CliError> {
    let settings = &run_settings.engine;
    if let Some(dir) = &run_settings.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("--output-dir {}: cannot create: {e}", dir.display()))?;
    }
    let feed = WarmupFeed {
        limit: args.given.warmup_limit,
        signature: settings.signature.clone(),
        tags: settings.tags.clone(),
        strict_dtypes: settings.strict_dtypes,
        values: settings.values,
        output_dir: run_settings.output_dir.clone(),
    };
    let key_settings = format!("{}\0{:?}\0{:?}", settings.signature, settings.tags, settings.libraries)
        + if settings.strict_dtypes { "\0strict_dtypes" } else { "" }
        + &crate::warmup::key_settings(args.given.warmup_limit);
    let plan = Plan {
        run: run_settings,
        quiet,
        started,
        started_at,
        engine: settings.clone(),
        models,
        work: Work::Feed(&feed),
        // Each model's requests are in its folder, which its key hashes.
        key_inputs: Vec::new(),
        key_settings,
        inputs_dir: None,
        expect_dir: None,
        report_settings: report_settings(args, run_settings),
    };
    execute(plan)
}

/// No inputs were given: a usage error, before any work, when a signature
/// read here needs some (listed, so that the user knows what to give). A
/// signature without inputs runs; Keras files and signatures this process
/// cannot read are left to their workers.
fn refuse_missing_inputs(models: &[Model], settings: &Settings) -> Result<(), String> {
    let mut needs = Vec::new();
    for model in models.iter().filter(|m| m.format == ModelFormat::SavedModel) {
        let Some(info) = signature_here(model, settings) else { continue };
        if !info.inputs.is_empty() {
            let takes: Vec<String> = info.inputs.iter().map(TensorSpec::describe).collect();
            needs.push(format!("  {}: {}", model.id, takes.join(", ")));
        }
    }
    if needs.is_empty() {
        return Ok(());
    }
    let total = needs.len();
    needs.truncate(10);
    if total > needs.len() {
        needs.push(format!("  ... and {} more", total - needs.len()));
    }
    Err(format!(
        "no inputs given (--inputs FILE.npz|FILE.json, --input NAME=PATH.npy or --input 'NAME=@[[...]]'), and \
         signature '{}' takes some:\n{}",
        settings.signature,
        needs.join("\n")
    ))
}
