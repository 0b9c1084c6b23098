//! `isorun eval`'s flags: `run`'s shared ones ([`SharedRunArgs`]) plus the
//! dataset, label, metrics, rules and baseline, and the message for one of
//! `run`'s own flags given to `eval`.

use super::run::SharedRunArgs;
use super::shared::gate_parser;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Args;
use isorun_eval::predictions::PredictionsFormat;
use isorun_report::change::Gate;
use isorun_report::shard::Shard;
use std::path::PathBuf;

/// `isorun eval`: `run`'s models, workers, limits and reports, fed a labelled dataset.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun eval models/ --data test.tfrecord --label label
  isorun eval models/ --data 'shards/*.tfrecord.gz' --label label \\
      --metric accuracy --metric auc --slice country
  isorun eval models/ --data test.npz --label y --threshold 'accuracy>=0.9' \\
      --report eval.json
  isorun eval models/ --data pets.parquet --label kind --label-classes cat,dog
  isorun eval models/ --data test.jsonl.gz --label label --slice country
  isorun eval models/ --data examples.txt --data-format jsonl --label label
  isorun eval models/ --data test.tfrecord --label label \\
      --baseline last-night.json --max-drop accuracy=1%
  isorun eval models/ --data test.tfrecord --label label --ci 0.95 \\
      --baseline last-night.json --max-drop accuracy=1% --gate significant

Each record is run's, plus \"examples\", \"metrics\" (and \"slices\", \"task\",
\"output\"). A metric below a --threshold bound or dropped past --max-drop ends
the model below_threshold (with --gate significant: only a significant drop;
see README \"Is the drop real?\").
Exit codes: 0 every model ok; 1 some model not ok; 2 usage error (nothing run),
or an output (--report, --junit, --html, --journal, --output-dir, --predictions)
another isorun is writing; 130/143 interrupted by Ctrl-C/SIGTERM.")]
pub struct EvalArgs {
    #[command(flatten)]
    pub eval: EvalOptions,

    // run's flags but its inputs (`RunInputArgs`) and --expect: not even parsed here.
    #[command(flatten)]
    pub run: SharedRunArgs,
}

/// What `eval` adds to `run`'s flags.
#[derive(Debug, Args)]
pub struct EvalOptions {
    /// The dataset: TFRecord files of tf.Example (.tfrecord, .tfrecords, .gz), .npz files, CSV,
    /// Parquet (.parquet), Arrow IPC (.arrow, .feather: what Hugging Face datasets writes), JSON
    /// Lines (.jsonl, .ndjson, .jsonl.gz: one object per line), folders of them or of NAME.npy
    /// arrays, or globs (repeatable; read in order).
    #[arg(long, value_name = "PATH", required = true, help_heading = "Evaluation")]
    pub data: Vec<PathBuf>,

    /// Read the --data files named (or matched by a glob) as this format whatever their names
    /// say: tfrecord, tfrecord-gzip, npz, npy-folder, csv, parquet, arrow (Arrow IPC, Feather),
    /// jsonl, jsonl-gzip (a folder's files are still chosen by their endings).
    #[arg(long, value_name = "NAME", value_parser = data_format_parser(), hide_possible_values = true, help_heading = "Evaluation")]
    pub data_format: Option<isorun_eval::Format>,

    /// The label: a tf.Example feature, an array name (.npz, .npy), or a table column (CSV,
    /// Parquet, Arrow) or key (JSON Lines). It never goes to the model.
    #[arg(long, value_name = "KEY", required = true, help_heading = "Evaluation")]
    pub label: String,

    /// Class names of a string label, in class index order (cat,dog,bird: cat is class 0): a
    /// label that is not one of them is an error naming the file, the row and the value.
    #[arg(long, value_name = "NAME,NAME,...", value_delimiter = ',', help_heading = "Evaluation")]
    pub label_classes: Option<Vec<String>>,

    /// A per-example weight (a feature, array, column or key, as --label), as scikit-learn's
    /// sample_weight.
    #[arg(long, value_name = "KEY", help_heading = "Evaluation")]
    pub weight: Option<String>,

    /// A metric (repeatable): accuracy, top_k_accuracy, auc, pr_auc, log_loss, precision, recall,
    /// f1, ece, brier, mse, mae, rmse, r2, mean_prediction, mean_label, calibration [default:
    /// chosen from the task].
    #[arg(long = "metric", value_name = "NAME", help_heading = "Evaluation")]
    pub metrics: Vec<String>,

    /// The output to score [default: the signature's only output].
    #[arg(long, value_name = "NAME", help_heading = "Evaluation")]
    pub output: Option<String>,

    /// Metrics per value of this feature too (repeatable).
    #[arg(long = "slice", value_name = "FEATURE", help_heading = "Evaluation")]
    pub slices: Vec<String>,

    /// A feature that names each example (an id): bootstrap weights (--ci) are drawn from it and
    /// predictions are matched by it [default: the example's index in the data].
    #[arg(long, value_name = "FEATURE", help_heading = "Evaluation")]
    pub example_key: Option<String>,

    /// Write each model's per-example predictions to DIR/<model id>.parquet (one row per
    /// example: index, key, label, weight, slice:<feature>, output:<name>), written batch by
    /// batch and put in place only when the model went through every batch; `isorun rescore`
    /// recomputes metrics from them without TensorFlow.
    #[arg(long, value_name = "DIR", help_heading = "Evaluation")]
    pub predictions: Option<PathBuf>,

    /// The predictions' format: parquet, or jsonl (one object per line; its description in
    /// <file>.isorun.json beside it).
    #[arg(long, value_name = "FORMAT", default_value = "parquet", value_parser = predictions_format_parser(), requires = "predictions", help_heading = "Evaluation")]
    pub predictions_format: PredictionsFormat,

    /// Save every output in the predictions, not only the scored one.
    #[arg(long, requires = "predictions", help_heading = "Evaluation")]
    pub predictions_all: bool,

    /// Feed the signature input INPUT from the feature FEATURE (repeatable).
    #[arg(long = "feature", value_name = "INPUT=FEATURE", help_heading = "Evaluation")]
    pub features: Vec<String>,

    /// Evaluate the first N examples only.
    #[arg(long, value_name = "N", help_heading = "Evaluation")]
    pub limit: Option<u64>,

    /// Evaluate shard K of N of the data only (whole files round-robin when there are at least N,
    /// else ranges of records), for one machine of N. Each record then carries the model's
    /// metric_state and the shard's partial_metrics; --threshold and --max-drop are not checked on
    /// a shard but by `isorun report merge`, which joins the N reports into exact metrics.
    #[arg(long, value_name = "K/N", value_parser = isorun_report::shard::parse_shard, help_heading = "Evaluation")]
    pub data_shard: Option<Shard>,

    /// Skip corrupt TFRecord records (counted) instead of ending the model with an error.
    #[arg(long, help_heading = "Evaluation")]
    pub skip_corrupt: bool,

    /// k of top_k_accuracy.
    #[arg(long, value_name = "K", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..), help_heading = "Evaluation")]
    pub top_k: u64,

    /// Equal-width confidence bins of ece (bin b holds confidences in (b/N, (b+1)/N], the first
    /// [0, 1/N]) and of the record's reliability diagram ("calibration").
    #[arg(long, value_name = "N", default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=10_000), help_heading = "Evaluation")]
    pub calibration_bins: u64,

    /// Classes up to which the record carries the full confusion matrix; past them, the top
    /// confusions ("top_confusions", from a bounded summary: "top_confusions_exact" says whether
    /// its counts are exact).
    #[arg(long, value_name = "N", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(2..=20_000), help_heading = "Evaluation")]
    pub max_confusion_classes: u64,

    /// Outputs are logits: sigmoid (binary) or softmax (multiclass) before probabilities.
    #[arg(long, help_heading = "Evaluation")]
    pub from_logits: bool,

    /// A number: the binary decision threshold [default: 0.5]. METRIC>=X or METRIC<=X: a bound
    /// the model must meet, else it ends below_threshold (repeatable).
    #[arg(long = "threshold", value_name = "X|RULE", help_heading = "Evaluation")]
    pub thresholds: Vec<String>,

    /// An earlier eval --report: --max-drop compares each model's metrics with it.
    #[arg(long, value_name = "REPORT.json", help_heading = "Evaluation")]
    pub baseline: Option<PathBuf>,

    /// METRIC=X (absolute) or METRIC=X% (relative): how much worse than the baseline a metric
    /// may get, in its own direction (repeatable).
    #[arg(long = "max-drop", value_name = "METRIC=X", requires = "baseline", help_heading = "Evaluation")]
    pub max_drops: Vec<String>,

    /// Add a LEVEL (e.g. 0.95) confidence interval to every metric, overall and per slice: a Poisson
    /// bootstrap in the same pass (each example weighted Poisson(1) per replicate, drawn from its
    /// --example-key or index, the same in every model and run). Records get "ci", "ci_level",
    /// "bootstrap" and "bootstrap_values" (what a later --baseline pairs with).
    #[arg(long, value_name = "LEVEL", help_heading = "Evaluation")]
    pub ci: Option<f64>,

    /// Bootstrap replicates for --ci [default: 200]; each is one more metric state in memory.
    #[arg(long, value_name = "N", help_heading = "Evaluation")]
    pub bootstrap: Option<u32>,

    /// The bootstrap generator's seed: the same seed, the same weights for the same examples.
    #[arg(long, value_name = "S", default_value_t = 0, help_heading = "Evaluation")]
    pub bootstrap_seed: u64,

    /// When a --max-drop breach fails a model: always (the drop alone), or significant (the drop
    /// AND a significant change: accuracy with both nights' --predictions by McNemar's exact test,
    /// else a paired bootstrap interval that excludes 0; a change that cannot be tested stays a
    /// breach). Needs --ci and a --baseline evaluated with the same --ci replicates and seed, or
    /// with --predictions.
    #[arg(
        long,
        value_name = "always|significant",
        default_value = "always",
        value_parser = gate_parser(),
        hide_possible_values = true,
        help_heading = "Evaluation"
    )]
    pub gate: Gate,
}

/// `--data-format`: a name of `isorun-eval`'s format registry; another is
/// clap's usage error listing them.
fn data_format_parser() -> impl TypedValueParser<Value = isorun_eval::Format> {
    PossibleValuesParser::new(isorun_eval::Format::names())
        .map(|name| isorun_eval::Format::from_name(&name).expect("a name of the registry"))
}

/// `--predictions-format`: `parquet` or `jsonl`.
fn predictions_format_parser() -> impl TypedValueParser<Value = PredictionsFormat> {
    PossibleValuesParser::new(["parquet", "jsonl"])
        .map(|name| PredictionsFormat::from_name(&name).expect("parquet or jsonl"))
}

/// The message for one of `run`'s own flags given to `eval` (`--rtol`, `--inputs`), which clap
/// refuses with the tip "to pass '--rtol' as a value, use '-- --rtol'": that would make it a
/// model path. `None` for every other error, which clap renders. `root` is
/// the whole command line's definition (`Cli::command()`).
pub fn run_flag_given_to_eval(
    error: &clap::Error,
    args: &[std::ffi::OsString],
    root: &clap::Command,
) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if error.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    // The command is the first word after the program's own flags (`-v`, `-q`).
    let command = args.iter().skip(1).map(|a| a.to_string_lossy()).find(|a| !a.starts_with('-'))?;
    if command != "eval" {
        return None;
    }
    let Some(ContextValue::String(given)) = error.get(ContextKind::InvalidArg) else { return None };
    let flag = given.split('=').next().unwrap_or(given);
    let longs = |name: &str| -> Vec<String> {
        let command = root.find_subcommand(name).into_iter();
        command.flat_map(|c| c.get_arguments()).filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect()
    };
    if !longs("run").iter().any(|l| l == flag) || longs("eval").iter().any(|l| l == flag) {
        return None;
    }
    let with = match flag {
        "--rtol" | "--atol" => " (with --expect)",
        "--input" | "--inputs" | "--inputs-dir" => "; eval reads its examples from --data",
        _ => "",
    };
    Some(format!("eval takes no {flag}: it is run's{with}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::{CommandFactory, Parser};

    /// `--data-format` names every format `isorun-eval` reads.
    #[test]
    fn data_format_help_names_every_format() {
        let eval = Cli::command().find_subcommand("eval").expect("eval").clone();
        let arg = eval.get_arguments().find(|a| a.get_id() == "data_format").expect("--data-format");
        let help = arg.get_help().expect("help").to_string();
        let words: Vec<&str> = help.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).collect();
        for name in isorun_eval::Format::names() {
            assert!(words.contains(&name), "--data-format's help leaves out {name}: {help}");
        }
    }

    /// `eval` parses none of `run`'s own flags: they are not in its help, and given they are
    /// clap's "unexpected argument" naming them.
    #[test]
    fn eval_takes_none_of_run_s_own_flags() {
        let run = Cli::command().find_subcommand("run").expect("run").clone();
        let eval = Cli::command().find_subcommand("eval").expect("eval").clone();
        let longs = |c: &clap::Command| -> Vec<String> {
            c.get_arguments().filter_map(|a| a.get_long()).map(str::to_string).collect()
        };
        let (run, eval) = (longs(&run), longs(&eval));
        let only_run: Vec<&String> = run.iter().filter(|l| !eval.contains(l)).collect();
        assert_eq!(
            only_run,
            [
                "input",
                "inputs",
                "inputs-dir",
                "warmup-inputs",
                "warmup-limit",
                "strict-dtypes",
                "values",
                "expect",
                "rtol",
                "atol"
            ]
        );
        let error = Cli::try_parse_from(["isorun", "eval", "m/", "--data", "d", "--label", "y", "--rtol", "1"])
            .expect_err("eval takes no --rtol");
        assert_eq!(error.kind(), clap::error::ErrorKind::UnknownArgument);
        assert!(error.to_string().contains("'--rtol'"), "{error}");
    }

    /// `--data-format`, `--gate`, `--data-shard` and `--predictions-format` are parsed by clap:
    /// a bad value is its usage error naming the flag, the value and (for the closed sets) the
    /// values it takes, before any file, model or worker is looked at; a good one arrives typed.
    #[test]
    fn typed_flags_refuse_a_bad_value_at_parse_time_naming_flag_and_value() {
        let eval = |extra: &[&str]| {
            let argv = ["isorun", "eval", "m/", "--data", "d", "--label", "y", "--predictions", "p/"];
            Cli::try_parse_from(argv.iter().chain(extra))
        };
        for (flag, bad, expected) in [
            ("--data-format", "json-lines", "jsonl-gzip"),
            ("--gate", "sometimes", "significant"),
            ("--data-shard", "3/3", "K must be from 0 to N-1"),
            ("--predictions-format", "csv", "parquet, jsonl"),
        ] {
            let error = eval(&[flag, bad]).expect_err(flag);
            use clap::error::ErrorKind::{InvalidValue, ValueValidation};
            assert!(matches!(error.kind(), InvalidValue | ValueValidation), "{flag} {bad}: {error}");
            let text = error.to_string();
            assert!(text.contains(&format!("'{bad}' for '{flag} <")), "{text}");
            assert!(text.contains(expected), "{text}");
        }
        let rescore = Cli::try_parse_from(["isorun", "rescore", "p/", "--gate", "sometimes"]).expect_err("--gate");
        assert_eq!(rescore.kind(), clap::error::ErrorKind::InvalidValue, "{rescore}");

        let flags = ["--data-format", "jsonl-gzip", "--gate", "significant", "--data-shard", "1/3"];
        let parsed = eval(&[&flags[..], &["--predictions-format", "jsonl"]].concat()).expect("good values");
        let super::super::Command::Eval(args) = parsed.command else { panic!("eval") };
        assert_eq!(args.eval.data_format, isorun_eval::Format::from_name("jsonl-gzip"));
        assert_eq!(args.eval.gate, Gate::Significant);
        assert_eq!(args.eval.data_shard, Some(Shard { index: 1, count: 3 }));
        assert_eq!(args.eval.predictions_format, PredictionsFormat::Jsonl);
        let defaults = eval(&[]).expect("defaults");
        let super::super::Command::Eval(args) = defaults.command else { panic!("eval") };
        assert_eq!((args.eval.data_format, args.eval.gate), (None, Gate::Always));
        assert_eq!(args.eval.predictions_format, PredictionsFormat::Parquet);
    }
}
