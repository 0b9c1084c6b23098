//! Embeds the engine: runs every SavedModel under a folder on the inputs
//! of one `.npz` file, each in its own worker, and prints one line per model.
use isorun_engine::locations::{libtensorflow_dir, worker_binary};
use isorun_engine::{discover, CancelToken, Discard, Engine, Event, PreparedInputs, Settings};
use isorun_tensors::inputs::load_inputs;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [models_dir, inputs_file] = args.as_slice() else { return Err("usage: embed MODELS INPUTS.npz".into()) };
    let models = discover(std::slice::from_ref(models_dir), &mut |warning| eprintln!("warning: {warning}"))?;
    let inputs = PreparedInputs::new(load_inputs(&[], std::slice::from_ref(inputs_file))?, None);

    let mut spawn = Settings::builder(worker_binary(None)?).build().spawn;
    spawn.lib_dir = libtensorflow_dir(None);
    let settings =
        Settings::builder(spawn.worker.clone()).spawn(spawn).jobs(2).timeout(Some(std::time::Duration::from_secs(60)));
    let engine = Engine::new(settings.build())?;

    let cancel = CancelToken::new();
    let mut failed = 0;
    let summary = engine.run(
        &models,
        &inputs,
        &cancel,
        &mut |event| {
            if let Event::Finished(report) = event {
                let model = &models[report.index];
                let outputs: Vec<String> = report.outputs.iter().map(|o| format!("{} {:?}", o.name, o.shape)).collect();
                failed += usize::from(!report.outcome.is_ok());
                println!(
                    "{}: {} {} ({} ms)",
                    model.id,
                    report.outcome.status(),
                    outputs.join(", "),
                    report.wall.as_millis()
                );
            }
        },
        &Discard,
    );
    println!("{} models, {failed} failed, TensorFlow {}", models.len(), summary.tensorflow_version.unwrap_or_default());
    Ok(())
}
