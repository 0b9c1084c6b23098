//! The flags of the commands that look at models without running them:
//! `isorun inspect` (one model's signatures) and `isorun ls` (the models
//! under folders).

use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun inspect models/resnet
  isorun inspect models/resnet --json | jq '.signatures.serving_default.inputs'")]
pub struct InspectArgs {
    /// A SavedModel folder, a .keras / full-model .h5 file, or an .onnx file (read without TensorFlow).
    #[arg(value_name = "MODEL")]
    pub model: PathBuf,

    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,

    /// Also show TensorFlow's internal signatures (`__saved_model_init_op`).
    #[arg(long)]
    pub all: bool,

    /// Tag set whose signatures are the top-level `signatures` in JSON (repeat for several tags).
    #[arg(long = "tag", value_name = "TAG", default_values_t = vec!["serve".to_string()])]
    pub tags: Vec<String>,
}

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun ls models/
  isorun ls models/ --json | jq -r .path | head -3
  isorun ls serving/ --latest-version")]
pub struct LsArgs {
    /// Folders to search (recursively) for SavedModels and Keras files.
    #[arg(value_name = "DIR", required = true)]
    pub dirs: Vec<PathBuf>,

    /// JSON Lines (`{"id": ..., "path": ..., "format": ...}`) instead of `id<TAB>path<TAB>format`.
    #[arg(long)]
    pub json: bool,

    /// With TensorFlow Serving's layout (model/1, model/2), keep only the highest version of each model.
    #[arg(long)]
    pub latest_version: bool,
}
