//! Embeds the engine: runs every model under a folder (SavedModels, Keras
//! and ONNX files) on the inputs of one `.npz` file, two at a time, each in
//! its own worker, and prints one line per model as it ends.
use isorun_engine::locations::{libtensorflow_dir, worker_binary};
use isorun_engine::{discover, CancelToken, Discard, Engine, Event, Outcome, PreparedInputs, Settings};
use isorun_tensors::inputs::load_inputs;
use std::path::PathBuf;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [models_dir, inputs_file] = args.as_slice() else { return Err("usage: embed MODELS INPUTS.npz".into()) };
    let models = discover(std::slice::from_ref(models_dir), &mut |warning| eprintln!("warning: {warning}"))?;
    let inputs = PreparedInputs::new(load_inputs(&[], std::slice::from_ref(inputs_file))?, None);

    let settings = Settings::builder(worker_binary(None)?)
        .libtensorflow_dir(libtensorflow_dir(None))
        .jobs(2)
        .timeout(Some(Duration::from_secs(60)));
    let engine = Engine::new(settings.build())?;

    let cancel = CancelToken::new(); // cancel.request(libc::SIGINT) from another thread stops the run
    let mut failed = 0;
    let mut on_event = |event| {
        if let Event::Finished(report) = event {
            let detail = match &report.outcome {
                Outcome::Ok => report.outputs.iter().map(|o| format!("{} {:?}", o.name, o.shape)).collect(),
                other => vec![other.to_string()],
            };
            failed += usize::from(!report.outcome.is_ok());
            println!("{}: {} {}", models[report.index].id, report.outcome.status(), detail.join(", "));
        }
    };
    let summary = engine.run(&models, &inputs, &cancel, &mut on_event, &Discard);
    println!("{} models, {failed} failed, TensorFlow {}", models.len(), summary.tensorflow_version.unwrap_or_default());
    Ok(())
}
