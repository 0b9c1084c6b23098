//! What a predictions file holds and how eval scored it: the settings
//! `rescore` starts from, and what it checks the file's columns against.

use crate::data::Labels;
use isorun_protocol::DType;
use serde_json::{json, Value};

/// The Parquet key-value metadata key (and the sidecar's only key).
pub const META_KEY: &str = "isorun";

/// One saved output column.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedOutput {
    pub name: String,
    /// The model's dtype (bfloat16 is stored as float32).
    pub dtype: DType,
    /// Every dimension of a row (the output's shape without its first).
    pub row_shape: Vec<u64>,
}

impl SavedOutput {
    /// Values per row.
    pub fn width(&self) -> usize {
        self.row_shape.iter().product::<u64>() as usize
    }

    /// A scalar column (`[N]`, `[N, 1]`), else a list column.
    pub fn scalar(&self) -> bool {
        self.width() == 1 && self.row_shape.len() <= 1
    }
}

/// A predictions file's description.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    pub model: String,
    /// The output eval scored.
    pub output: String,
    /// Its declared shape in the signature (`None`: unknown rank).
    pub output_shape: Option<Vec<Option<u64>>>,
    /// The output columns, in order (the scored one among them).
    pub outputs: Vec<SavedOutput>,
    /// `int`, `float` or `matrix:<columns>`.
    pub label_kind: Option<String>,
    pub label: String,
    pub weight: Option<String>,
    pub slices: Vec<String>,
    pub example_key: Option<String>,
    pub metrics: Vec<String>,
    pub threshold: f64,
    pub top_k: usize,
    pub from_logits: bool,
    /// The task eval decided (`binary`, `multiclass`, `regression`).
    pub task: Option<String>,
    /// Rows of eval's first batch: the task is decided on them, so
    /// `rescore` scores the same rows first.
    pub first_batch_rows: u64,
    pub examples: u64,
    pub data_digest: String,
    pub data_shard: Option<String>,
    /// `--skip-corrupt`: the records eval skipped (the record's `skipped_corrupt`).
    pub skipped_corrupt: u64,
    /// eval's `--calibration-bins` (for `ece`).
    pub calibration_bins: usize,
    /// eval's `--max-confusion-classes`, as the file claims it: never a
    /// size (rescore clamps it to its own default, `MAX_CONFUSION_CLASSES`).
    pub max_confusion_classes: usize,
}

pub(crate) fn label_kind(labels: &Labels) -> String {
    match labels {
        Labels::Int(_) => "int".into(),
        Labels::Float(_) => "float".into(),
        Labels::Matrix { columns, .. } => format!("matrix:{columns}"),
    }
}

impl Meta {
    /// The description of a run scoring against `label`, with eval's
    /// defaults for the metric settings ([`MetricsSpec::default`]) and
    /// nothing yet of the model (its name, output and shape, the task, the
    /// counts: the writer fills those in). Callers set what differs with
    /// struct-update syntax.
    ///
    /// [`MetricsSpec::default`]: crate::MetricsSpec
    pub fn new(label: impl Into<String>) -> Meta {
        let spec = crate::MetricsSpec::default();
        Meta {
            model: String::new(),
            output: String::new(),
            output_shape: None,
            outputs: Vec::new(),
            label_kind: None,
            label: label.into(),
            weight: None,
            slices: Vec::new(),
            example_key: None,
            metrics: Vec::new(),
            threshold: spec.threshold,
            top_k: spec.top_k,
            from_logits: spec.from_logits,
            task: None,
            first_batch_rows: 0,
            examples: 0,
            data_digest: String::new(),
            data_shard: None,
            skipped_corrupt: 0,
            calibration_bins: spec.calibration_bins,
            max_confusion_classes: spec.max_confusion_classes,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "version": 1,
            "model": self.model,
            "output": self.output,
            "output_shape": self.output_shape,
            "outputs": self.outputs.iter().map(|o| json!({
                "name": o.name, "dtype": o.dtype.name(), "row_shape": o.row_shape,
            })).collect::<Vec<_>>(),
            "label": self.label,
            "label_kind": self.label_kind,
            "weight": self.weight,
            "slices": self.slices,
            "example_key": self.example_key,
            "metrics": self.metrics,
            "threshold": self.threshold,
            "top_k": self.top_k,
            "from_logits": self.from_logits,
            "task": self.task,
            "first_batch_rows": self.first_batch_rows,
            "examples": self.examples,
            "data_digest": self.data_digest,
            "data_shard": self.data_shard,
            "skipped_corrupt": self.skipped_corrupt,
            "calibration_bins": self.calibration_bins,
            "max_confusion_classes": self.max_confusion_classes,
        })
    }

    /// Reads [`Meta::to_json`]'s object; the error says which key is wrong.
    pub fn from_json(value: &Value) -> Result<Meta, String> {
        let text = |key: &str| value[key].as_str().map(str::to_string).ok_or(format!("'{key}' is not a string"));
        let opt_text = |key: &str| match &value[key] {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s.clone())),
            _ => Err(format!("'{key}' is not a string")),
        };
        let texts = |key: &str| -> Result<Vec<String>, String> {
            value[key]
                .as_array()
                .ok_or(format!("'{key}' is not a list"))?
                .iter()
                .map(|v| v.as_str().map(str::to_string).ok_or(format!("'{key}' holds a non-string")))
                .collect()
        };
        let number = |key: &str| value[key].as_u64().ok_or(format!("'{key}' is not a count"));
        if value["version"].as_u64() != Some(1) {
            return Err(format!("version {} is not 1 (written by a newer isorun?)", value["version"]));
        }
        let outputs = value["outputs"]
            .as_array()
            .ok_or("'outputs' is not a list")?
            .iter()
            .map(|o| {
                let name = o["name"].as_str().ok_or("an output has no name")?.to_string();
                let dtype = o["dtype"]
                    .as_str()
                    .and_then(DType::from_name)
                    .ok_or(format!("output '{name}' has no known dtype"))?;
                let row_shape = o["row_shape"]
                    .as_array()
                    .ok_or(format!("output '{name}' has no row_shape"))?
                    .iter()
                    .map(|d| d.as_u64().ok_or(format!("output '{name}': a dimension is not a count")))
                    .collect::<Result<Vec<u64>, String>>()?;
                // Its values per row (`width`) must be a number, not a wrap.
                let width = row_shape.iter().try_fold(1u64, |values, &d| values.checked_mul(d));
                if width.and_then(|w| usize::try_from(w).ok()).is_none() {
                    return Err(format!("output '{name}': row_shape {row_shape:?} is more values than a count holds"));
                }
                Ok(SavedOutput { name, dtype, row_shape })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let output_shape = match &value["output_shape"] {
            Value::Null => None,
            Value::Array(dims) => Some(
                dims.iter()
                    .map(|d| match d {
                        Value::Null => Ok(None),
                        d => d.as_u64().map(Some).ok_or("'output_shape' holds a non-count".to_string()),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            _ => return Err("'output_shape' is not a list".into()),
        };
        Ok(Meta {
            model: text("model")?,
            output: text("output")?,
            output_shape,
            outputs,
            label: text("label")?,
            label_kind: opt_text("label_kind")?,
            weight: opt_text("weight")?,
            slices: texts("slices")?,
            example_key: opt_text("example_key")?,
            metrics: texts("metrics")?,
            threshold: value["threshold"].as_f64().ok_or("'threshold' is not a number")?,
            top_k: number("top_k")? as usize,
            from_logits: value["from_logits"].as_bool().ok_or("'from_logits' is not true or false")?,
            task: opt_text("task")?,
            first_batch_rows: number("first_batch_rows")?,
            examples: number("examples")?,
            data_digest: text("data_digest")?,
            data_shard: opt_text("data_shard")?,
            skipped_corrupt: value["skipped_corrupt"].as_u64().unwrap_or(0),
            calibration_bins: match value["calibration_bins"].as_u64() {
                None => 15,
                Some(n) if (1..=crate::calibration::MAX_CALIBRATION_BINS as u64).contains(&n) => n as usize,
                Some(n) => {
                    return Err(format!(
                        "'calibration_bins' {n} is not 1 to {}",
                        crate::calibration::MAX_CALIBRATION_BINS
                    ))
                }
            },
            max_confusion_classes: value["max_confusion_classes"].as_u64().map_or(1000, |n| n as usize),
        })
    }

    /// The saved output `name`.
    pub fn saved(&self, name: &str) -> Option<&SavedOutput> {
        self.outputs.iter().find(|o| o.name == name)
    }
}
