//! The `isorun run` (or `isorun eval`) arguments given to `isorun slurm submit`, made fit for a
//! batch job that starts later, on another machine: relative paths become
//! absolute, and the flags submit sets for each task itself are refused
//! rather than silently overridden. Options are recognised from clap's own
//! definition of `run`, so the split into options and values always agrees
//! with what `isorun run` will parse.

use crate::cli::Cli;
use clap::{Arg, CommandFactory};
use std::ffi::OsString;
use std::path::Path;

/// One command-line item of `run`: an option with its value (`--inputs
/// /abs/x.npz`, `--timeout=60`), a switch, or a MODEL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunArg {
    /// The words as they go into the script, in order.
    pub words: Vec<String>,
}

/// Options whose value is a path (made absolute). `input` is `NAME=PATH`;
/// `data` (eval's) may be a glob, made absolute as it is.
const PATH_OPTIONS: [&str; 12] = [
    "inputs",
    "inputs_dir",
    "load_library",
    "output_dir",
    "expect",
    "worker",
    "libtensorflow_dir",
    "config",
    "data",
    "baseline",
    // map's
    "items_from",
    "writable",
];

/// Options that submit sets for every task, and why they cannot be given.
const SET_BY_SUBMIT: [(&str, &str); 9] = [
    ("shard", "each array task runs --shard K/N: choose N with --shards"),
    ("data_shard", "each array task runs --data-shard K/N: choose N with --data-shards"),
    ("journal", "each task keeps its journal in DIR/shards/K.journal.jsonl"),
    ("resume", "each task resumes from its journal in DIR/shards/K.journal.jsonl"),
    ("report", "each task writes DIR/shards/K.json, and the merge job DIR/report.json"),
    ("junit", "the merge job writes DIR/report.xml"),
    ("html", "the merge job writes DIR/report.html"),
    ("format", "each task writes JSON lines to DIR/shards/K.jsonl"),
    ("json", "each task writes JSON lines to DIR/shards/K.jsonl"),
];

/// Why a flag may not be given to submit, if it may not.
pub fn set_by_submit(id: &str) -> Option<&'static str> {
    SET_BY_SUBMIT.iter().find(|(flag, _)| *flag == id).map(|(_, why)| *why)
}

/// What the array tasks run: `isorun run`, `isorun eval` or `isorun map`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskCommand {
    Run,
    Eval,
    Map,
}

impl TaskCommand {
    /// `run`, `eval` or `map`.
    pub fn name(self) -> &'static str {
        match self {
            TaskCommand::Run => "run",
            TaskCommand::Eval => "eval",
            TaskCommand::Map => "map",
        }
    }

    /// The command of RUN ARGS: a first word `eval`, `map` or `run` names it (and
    /// is taken off); anything else is `run`'s arguments, as before `eval`
    /// could be submitted.
    pub fn split(raw: &[OsString]) -> (TaskCommand, &[OsString]) {
        match raw.first().and_then(|word| word.to_str()) {
            Some("eval") => (TaskCommand::Eval, &raw[1..]),
            Some("map") => (TaskCommand::Map, &raw[1..]),
            Some("run") => (TaskCommand::Run, &raw[1..]),
            _ => (TaskCommand::Run, raw),
        }
    }
}

/// `isorun run` (or `eval`) as clap defines it, global flags (`-v`, `-q`) included.
pub fn run_command(command: TaskCommand) -> clap::Command {
    let mut root = Cli::command();
    root.build();
    root.find_subcommand(command.name()).expect("isorun has the command").clone()
}

/// The run arguments, split into items, with relative paths made absolute
/// (against the current folder). A flag submit sets itself, a `-` (stdin)
/// input, or a word that is not UTF-8 is an error. `map`'s words that are
/// not options (MODULE:FUNCTION, the items) stay as given: an item is JSON
/// or text, not a path, and the tasks start in the submit folder anyway.
pub fn prepare(raw: &[OsString], task: TaskCommand) -> Result<Vec<RunArg>, String> {
    let words = raw
        .iter()
        .map(|word| word.to_str().map(str::to_string).ok_or_else(|| format!("{}: not UTF-8", word.to_string_lossy())))
        .collect::<Result<Vec<String>, String>>()?;
    let command = run_command(task);
    let arguments: Vec<&Arg> = command.get_arguments().collect();
    let by_long = |name: &str| {
        arguments.iter().copied().find(|arg| {
            arg.get_long() == Some(name) || arg.get_all_aliases().is_some_and(|aliases| aliases.contains(&name))
        })
    };
    let by_short = |letter: char| arguments.iter().copied().find(|arg| arg.get_short() == Some(letter));
    let takes_value = |arg: &Arg| arg.get_action().takes_values();

    let mut items = Vec::new();
    let mut words = words.into_iter();
    let mut only_models = false;
    while let Some(word) = words.next() {
        if task == TaskCommand::Map && (only_models || word == "-" || !word.starts_with('-')) {
            items.push(RunArg { words: vec![word] });
        } else if only_models {
            items.push(RunArg { words: vec![absolute(&word, "MODEL")?] });
        } else if word == "--" {
            only_models = true;
            items.push(RunArg { words: vec![word] });
        } else if let Some(long) = word.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((name, value)) => (name.to_string(), Some(value.to_string())),
                None => (long.to_string(), None),
            };
            let Some(arg) = by_long(&name) else {
                // Unknown to `run`: left for clap to refuse with its own message.
                items.push(RunArg { words: vec![word] });
                continue;
            };
            let id = arg.get_id().as_str();
            if let Some(why) = set_by_submit(id) {
                return Err(format!("--{name} cannot be given to isorun slurm submit: {why}"));
            }
            if !takes_value(arg) {
                items.push(RunArg { words: vec![word] });
                continue;
            }
            let flag = format!("--{name}");
            match inline {
                Some(value) => items.push(RunArg { words: vec![format!("{flag}={}", rewrite(id, &flag, &value)?)] }),
                None => match words.next() {
                    Some(value) => items.push(RunArg { words: vec![flag.clone(), rewrite(id, &flag, &value)?] }),
                    None => items.push(RunArg { words: vec![flag] }),
                },
            }
        } else if word.len() > 1 && word.starts_with('-') {
            // Short flags, maybe clustered (`-vv`, `-j4`, `-qj 4`): none takes a path,
            // so the words stay as they are; only a value in the next word is kept with them.
            let letters: Vec<char> = word[1..].chars().collect();
            let mut needs_next = false;
            for (position, &letter) in letters.iter().enumerate() {
                if let Some(arg) = by_short(letter) {
                    if let Some(why) = set_by_submit(arg.get_id().as_str()) {
                        return Err(format!("-{letter} cannot be given to isorun slurm submit: {why}"));
                    }
                    if takes_value(arg) {
                        needs_next = position + 1 == letters.len();
                        break;
                    }
                }
            }
            let mut item = vec![word];
            if needs_next {
                item.extend(words.next());
            }
            items.push(RunArg { words: item });
        } else {
            items.push(RunArg { words: vec![absolute(&word, "MODEL")?] });
        }
    }
    Ok(items)
}

/// The value of option `id` as the script gives it.
fn rewrite(id: &str, flag: &str, value: &str) -> Result<String, String> {
    if (id == "inputs" || id == "items_from") && value == "-" {
        return Err(format!("{flag} -: a batch job has no stdin; give the inputs as a file"));
    }
    if id == "input" {
        // NAME=PATH (a .npy or .json file) or NAME=@JSON (inline).
        return match value.split_once('=') {
            Some((name, path)) if !path.starts_with('@') && !path.is_empty() => {
                Ok(format!("{name}={}", absolute(path, flag)?))
            }
            _ => Ok(value.to_string()),
        };
    }
    if PATH_OPTIONS.contains(&id) && !value.is_empty() {
        return absolute(value, flag);
    }
    Ok(value.to_string())
}

/// `path` made absolute against the current folder (not resolving links).
fn absolute(path: &str, what: &str) -> Result<String, String> {
    if path.is_empty() {
        return Ok(String::new());
    }
    let absolute = std::path::absolute(Path::new(path)).map_err(|e| format!("{what} {path}: {e}"))?;
    absolute.to_str().map(str::to_string).ok_or_else(|| format!("{what} {path}: not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(args: &[&str]) -> Result<Vec<Vec<String>>, String> {
        let raw: Vec<OsString> = args.iter().map(OsString::from).collect();
        prepare(&raw, TaskCommand::Run).map(|items| items.into_iter().map(|item| item.words).collect())
    }

    fn here(path: &str) -> String {
        std::env::current_dir().unwrap().join(path).to_str().unwrap().to_string()
    }

    #[test]
    fn paths_become_absolute_and_other_values_stay() {
        let items = prepared(&[
            "models",
            "--inputs",
            "x.npz",
            "--input=a=a.npy",
            "--input",
            "b=@[1, 2]",
            "--timeout",
            "-1",
            "-j4",
            "-vq",
            "--signature",
            "add",
            "--output-dir=/abs/out",
            "--values",
            "--",
            "other",
        ])
        .unwrap();
        assert_eq!(
            items,
            [
                vec![here("models")],
                vec!["--inputs".into(), here("x.npz")],
                vec![format!("--input=a={}", here("a.npy"))],
                vec!["--input".into(), "b=@[1, 2]".into()],
                vec!["--timeout".into(), "-1".into()],
                vec!["-j4".into()],
                vec!["-vq".into()],
                vec!["--signature".into(), "add".into()],
                vec!["--output-dir=/abs/out".into()],
                vec!["--values".into()],
                vec!["--".into()],
                vec![here("other")],
            ]
        );
        assert_eq!(prepared(&["-j", "2", "m"]).unwrap(), [vec!["-j".to_string(), "2".into()], vec![here("m")]]);
    }

    #[test]
    fn flags_submit_sets_are_refused() {
        for flag in ["--shard=0/2", "--journal", "--resume", "--report", "--junit", "--html", "--json", "--format"] {
            let error = prepared(&["models", flag, "x"]).unwrap_err();
            assert!(error.contains("cannot be given to isorun slurm submit"), "{flag}: {error}");
        }
        assert!(prepared(&["models", "--inputs", "-"]).unwrap_err().contains("no stdin"));
    }

    #[test]
    fn eval_s_data_and_baseline_become_absolute_and_its_data_shard_is_refused() {
        let raw: Vec<OsString> = ["eval", "models", "--data", "d/*.tfrecord", "--baseline=b.json", "--label", "y"]
            .map(OsString::from)
            .into();
        let (task, rest) = TaskCommand::split(&raw);
        assert_eq!(task, TaskCommand::Eval);
        let items: Vec<Vec<String>> = prepare(rest, task).unwrap().into_iter().map(|item| item.words).collect();
        assert_eq!(
            items,
            [
                vec![here("models")],
                vec!["--data".into(), here("d/*.tfrecord")],
                vec![format!("--baseline={}", here("b.json"))],
                vec!["--label".into(), "y".into()],
            ]
        );
        let raw: Vec<OsString> = ["m", "--data-shard", "0/2"].map(OsString::from).into();
        let error = prepare(&raw, TaskCommand::Eval).unwrap_err();
        assert!(error.contains("--data-shard cannot be given to isorun slurm submit"), "{error}");
    }

    #[test]
    fn map_s_items_stay_as_given_its_files_become_absolute_and_its_shard_is_refused() {
        let raw: Vec<OsString> =
            ["map", "fns:f", "1", "a/b.txt", "-2", "--items-from", "items.txt", "--writable=w", "-j", "2"]
                .map(OsString::from)
                .into();
        let (task, rest) = TaskCommand::split(&raw);
        assert_eq!(task, TaskCommand::Map);
        let items: Vec<Vec<String>> = prepare(rest, task).unwrap().into_iter().map(|item| item.words).collect();
        let word = |w: &str| vec![w.to_string()];
        assert_eq!(
            items,
            [
                word("fns:f"),
                word("1"),
                word("a/b.txt"),
                word("-2"),
                vec!["--items-from".into(), here("items.txt")],
                vec![format!("--writable={}", here("w"))],
                vec!["-j".into(), "2".into()],
            ]
        );
        let refused = |args: &[&str]| prepare(&args.iter().map(OsString::from).collect::<Vec<_>>(), task).unwrap_err();
        assert!(refused(&["fns:f", "--shard", "0/2"]).contains("--shard cannot be given"));
        assert!(refused(&["fns:f", "--items-from", "-"]).contains("no stdin"));
    }
}
