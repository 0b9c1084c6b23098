//! Help that helps (issue 42 §6): each command's `--help`, `-h`, `isorun
//! help CMD` and man page list only the flags the command takes (eval
//! refuses `run`'s inputs at parsing), say what the flags take, and show
//! examples that copy and paste: never wrapped inside a command in help, nor
//! hyphenated in a man page.

use crate::util::{isorun, run, Ran};
use std::collections::BTreeSet;
use std::path::Path;

/// `run`'s flags that give inputs, keep values or compare with golden
/// outputs: eval's inputs come from `--data`.
const RUN_ONLY: [&str; 10] = [
    "--input",
    "--inputs",
    "--inputs-dir",
    "--warmup-inputs",
    "--warmup-limit",
    "--values",
    "--strict-dtypes",
    "--expect",
    "--rtol",
    "--atol",
];

/// `isorun ARGS` at a terminal width of `columns`, which must succeed.
fn help(args: &[&str], columns: usize) -> String {
    let ran = run(isorun().args(args).env("COLUMNS", columns.to_string()));
    assert_eq!(ran.code, Some(0), "isorun {args:?}\nstdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    ran.stdout
}

/// Every `--flag` a text names.
fn flags(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(str::to_string)
        .collect()
}

/// The help of one flag in long help (`--help`): its line to the next blank line.
fn flag_help<'a>(text: &'a str, flag: &str) -> &'a str {
    let start = text.find(&format!("      {flag} ")).unwrap_or_else(|| panic!("{flag} is not in the help:\n{text}"));
    let end = text[start..].find("\n\n").map_or(text.len(), |n| start + n);
    &text[start..end]
}

#[test]
fn eval_help_lists_only_the_flags_eval_takes() {
    for args in [&["eval", "--help"][..], &["eval", "-h"], &["help", "eval"]] {
        let text = help(args, 100);
        let named = flags(&text);
        for flag in RUN_ONLY {
            assert!(!named.contains(flag), "isorun {args:?} lists {flag}, which eval does not take:\n{text}");
        }
        for flag in ["--data", "--label", "--batch-size", "--output-dir", "--report", "--jobs", "--signature"] {
            assert!(named.contains(flag), "isorun {args:?} lacks {flag}:\n{text}");
        }
    }
    // run keeps every flag it had.
    let run_help = flags(&help(&["run", "--help"], 100));
    for flag in RUN_ONLY.iter().chain(&["--batch-size", "--output-dir", "--report", "--jobs", "--summary"]) {
        assert!(run_help.contains(*flag), "isorun run --help lacks {flag}");
    }
    let man = run(isorun().args(["man", "eval"]));
    assert_eq!(man.code, Some(0), "{}", man.stderr);
    let man_flags = flags(&man.stdout.replace("\\-", "-"));
    for flag in RUN_ONLY {
        assert!(!man_flags.contains(flag), "isorun man eval lists {flag}");
    }
    assert!(man_flags.contains("--label") && man_flags.contains("--batch-size"), "{man_flags:?}");
}

#[test]
fn eval_help_names_every_data_format_and_table_columns() {
    let text = help(&["eval", "--help"], 100);
    let formats = flag_help(&text, "--data-format");
    for name in ["tfrecord", "tfrecord-gzip", "npz", "npy-folder", "csv", "parquet", "arrow", "jsonl", "jsonl-gzip"] {
        assert!(
            formats.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).any(|w| w == name),
            "--data-format's help leaves out {name}:\n{formats}"
        );
    }
    let label = flag_help(&text, "--label");
    assert!(label.contains("column"), "--label's help does not name table columns:\n{label}");
}

/// A run-only flag given to eval is refused before anything is read, by the
/// parser, naming the flag (`--rtol` used to be taken and do nothing).
#[test]
fn eval_refuses_run_only_flags_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("missing.tfrecord");
    let values: [(&str, &[&str]); 10] = [
        ("--rtol", &["1"]),
        ("--atol", &["1"]),
        ("--input", &["x=a.npy"]),
        ("--inputs", &["a.npz"]),
        ("--inputs-dir", &["d"]),
        ("--warmup-inputs", &[]),
        ("--warmup-limit", &["1"]),
        ("--values", &[]),
        ("--strict-dtypes", &[]),
        ("--expect", &["golden"]),
    ];
    for (flag, value) in values {
        let ran: Ran = run(isorun()
            .current_dir(tmp.path())
            .args(["eval", "models", "--label", "y", "--data"])
            .arg(&data)
            .arg(flag)
            .args(value));
        assert_eq!(ran.code, Some(2), "eval {flag}: {}", ran.stderr);
        assert_eq!(ran.stdout, "", "eval {flag}");
        // Whose flag it is, not clap's tip to pass it after `--` (which would make it a model path).
        let with = match flag {
            "--rtol" | "--atol" => " (with --expect)",
            "--input" | "--inputs" | "--inputs-dir" => "; eval reads its examples from --data",
            _ => "",
        };
        assert_eq!(ran.stderr, format!("isorun: error: eval takes no {flag}: it is run's{with}\n"), "eval {flag}");
    }
    // `--rtol=1` and flags before the command too.
    let ran = run(isorun().current_dir(tmp.path()).args(["-q", "eval", "models", "--label", "y", "--rtol=1"]));
    assert_eq!(
        (ran.code, ran.stderr.as_str()),
        (Some(2), "isorun: error: eval takes no --rtol: it is run's (with --expect)\n")
    );
    // Any other unknown flag, and run's flags given to other commands, are clap's to render.
    for args in [&["eval", "models", "--label", "y", "--bogus"][..], &["pipe", "models/m", "--rtol", "1"]] {
        let ran = run(isorun().current_dir(tmp.path()).args(args));
        assert_eq!(ran.code, Some(2), "{args:?}: {}", ran.stderr);
        assert!(ran.stderr.starts_with("error: unexpected argument '--"), "{args:?}: {}", ran.stderr);
    }
}

/// The top-level help's lines for `ls` and `inspect` name the .onnx files they list and show.
#[test]
fn top_level_help_says_ls_and_inspect_take_onnx_files() {
    let text = help(&["--help"], 200);
    for command in ["ls", "inspect"] {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{command} ")))
            .unwrap_or_else(|| panic!("no {command} line:\n{text}"));
        assert!(line.contains(".onnx"), "isorun --help: {line}");
    }
    let inspect = help(&["inspect", "--help"], 200);
    assert!(inspect.lines().any(|l| l.contains(".onnx")), "isorun inspect --help:\n{inspect}");
}

#[test]
fn exit_codes_name_an_output_file_another_run_writes() {
    for command in ["run", "eval", "map"] {
        let text = help(&[command, "--help"], 100);
        let codes = &text[text.find("Exit codes:").unwrap_or_else(|| panic!("{command}: no exit codes:\n{text}"))..];
        let codes = codes.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            codes.contains("another isorun") && codes.contains("--report"),
            "isorun {command} --help: exit 2 for an output file locked by another run is not said:\n{codes}"
        );
    }
}

/// Every page `isorun man --out-dir` writes, as the words of its command
/// (`isorun-report-diff.1`: `report diff`), the root page first.
fn commands(dir: &Path) -> Vec<(String, Vec<String>)> {
    let ran = run(isorun().arg("man").arg("--out-dir").arg(dir));
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let mut pages: Vec<(String, Vec<String>)> = ran
        .stdout
        .lines()
        .map(|path| {
            let name = Path::new(path).file_stem().unwrap().to_str().unwrap().to_string();
            let words = name.split('-').skip(1).map(str::to_string).collect();
            (name, words)
        })
        .collect();
    pages.sort_by_key(|(_, words)| words.len());
    assert!(pages.len() >= 15, "{pages:?}");
    pages
}

/// The lines of a help's examples: those after `Examples:` to the next blank line.
fn example_lines(help: &str) -> Vec<&str> {
    let Some(start) = help.find("\nExamples:\n") else { return Vec::new() };
    help[start + "\nExamples:\n".len()..].lines().take_while(|l| !l.trim().is_empty()).collect()
}

#[test]
fn examples_never_wrap_inside_a_command() {
    let tmp = tempfile::tempdir().unwrap();
    let mut shown = 0;
    for (page, words) in commands(&tmp.path().join("man1")) {
        let mut args: Vec<&str> = words.iter().map(String::as_str).collect();
        args.push("--help");
        let wide = help(&args, 10_000);
        let examples = example_lines(&wide);
        shown += examples.len();
        for line in &examples {
            assert!(line.starts_with("  "), "{page}: an example line is not indented as a command: {line:?}");
        }
        for columns in [80, 100] {
            let narrow = help(&args, columns);
            assert_eq!(
                example_lines(&narrow),
                examples,
                "{page}: at {columns} columns an example wraps inside a command:\n{narrow}"
            );
        }
    }
    assert!(shown > 30, "{shown} example lines in all");
}

#[test]
fn man_page_examples_are_not_filled_or_hyphenated() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("man1");
    let man = which("man");
    for (page, words) in commands(&dir) {
        let mut args: Vec<&str> = words.iter().map(String::as_str).collect();
        args.push("--help");
        let examples = example_lines(&help(&args, 10_000)).into_iter().map(str::to_string).collect::<Vec<_>>();
        let roff = std::fs::read_to_string(dir.join(format!("{page}.1"))).unwrap();
        // The roff itself: no hyphenation, and the examples in a no-fill block, a line each.
        assert!(roff.lines().any(|l| l == ".nh"), "{page}: hyphenation is not turned off:\n{roff}");
        if !examples.is_empty() {
            let block_start = roff.find("\n.nf\n").unwrap_or_else(|| panic!("{page}: no .nf block:\n{roff}"));
            let block = &roff[block_start + 5..];
            let block = &block[..block.find("\n.fi\n").unwrap_or_else(|| panic!("{page}: .nf without .fi"))];
            let unescaped: Vec<String> = block.lines().map(unroff).collect();
            let want: Vec<String> = examples.iter().map(|l| l.to_string()).collect();
            assert_eq!(unescaped, want, "{page}: the examples' block is not the help's examples:\n{roff}");
        }
        // As man shows it at 80 columns: each example on one line, nothing hyphenated.
        let Some(man) = &man else { continue };
        let shown = std::process::Command::new(man)
            .arg("-l")
            .arg(dir.join(format!("{page}.1")))
            .env("MANWIDTH", "80")
            .env("MAN_KEEP_FORMATTING", "")
            .env_remove("MANPAGER")
            .env_remove("PAGER")
            .output()
            .unwrap();
        assert!(shown.status.success(), "man -l {page}: {}", String::from_utf8_lossy(&shown.stderr));
        let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
        for line in shown.lines() {
            assert!(!line.trim_end().ends_with('\u{2010}'), "{page}: man hyphenates a word: {line:?}\n{shown}");
        }
        let plain = shown.replace(['\u{2010}', '\u{2212}'], "-");
        for example in &examples {
            assert!(
                plain.lines().any(|l| l.trim_end().ends_with(example.trim_end())),
                "{page}: man does not show {example:?} on one line:\n{shown}"
            );
        }
    }
}

/// A roff text line as it reads: `\-` a dash, `\*(Aq` an apostrophe, `\\` a backslash, `\&` nothing.
fn unroff(line: &str) -> String {
    line.replace("\\-", "-").replace("\\*(Aq", "'").replace("\\&", "").replace("\\\\", "\\")
}

/// A program on PATH, if there is one.
fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|dir| Path::new(dir).join(program)).find(|p| p.is_file())
}
