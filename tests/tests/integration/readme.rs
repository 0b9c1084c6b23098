//! The README's commands, run as written: a new user copies them, so a
//! command that fails or prints something else than the README shows is a
//! bug (issue 42 §8). A section's `sh` blocks run in one bash, from the
//! repository, with the built `isorun` first on `PATH` (as the README says
//! to put it there), on a terminal (`script`), since the README shows what
//! a terminal shows. The `# ` lines right under a command are what it
//! prints: each must be in its output, whitespace aside, `...` standing for
//! what varies (times, memory, columns left out). A command exits 0 unless
//! the comment before it says `exit 1`. Nothing may be written into the
//! repository; the README's scratch folder, `/tmp/isorun-try`, is the
//! test's own temporary folder.

use crate::util::bin_dir;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

/// One command of a block: its text (continuation lines joined), the
/// comment lines before it and the output lines the README shows under it.
#[derive(Debug, Default)]
struct Step {
    command: String,
    said_before: Vec<String>,
    shows: Vec<String>,
}

/// The `sh` blocks of the section headed `title` (`## ` or `### `), up to
/// the next heading.
fn section_blocks(readme: &str, title: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let (mut inside, mut fenced, mut block) = (false, false, None::<String>);
    for line in readme.lines() {
        if !fenced && line.starts_with('#') {
            let heading = line.trim_start_matches('#');
            if heading.starts_with(' ') {
                if inside {
                    break;
                }
                inside = heading.trim() == title;
                continue;
            }
        }
        if line.starts_with("```") {
            fenced = !fenced;
            if let Some(done) = block.take() {
                blocks.push(done);
            } else if fenced && inside && line.trim() == "```sh" {
                block = Some(String::new());
            }
            continue;
        }
        if let Some(block) = &mut block {
            block.push_str(line);
            block.push('\n');
        }
    }
    assert!(inside, "no section '{title}' in README.md");
    blocks
}

/// A block's commands. A run of comments right under a command is what it
/// prints, unless a command follows the run at once: then the run says what
/// that command is for, as a run after a blank line does.
fn steps(blocks: &[String]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    for block in blocks {
        let mut comments: Vec<String> = Vec::new();
        let mut under_command = false;
        let mut pending = String::new();
        for line in block.lines().chain(std::iter::once("")) {
            if !pending.is_empty() || (!line.starts_with('#') && !line.trim().is_empty()) {
                pending.push_str(line);
                pending.push('\n');
                if !line.ends_with('\\') {
                    let command = std::mem::take(&mut pending);
                    steps.push(Step { command, said_before: std::mem::take(&mut comments), shows: vec![] });
                    under_command = true;
                }
            } else if let Some(comment) = line.strip_prefix("# ") {
                comments.push(comment.to_string());
            } else {
                // A blank line: the comments above it were the last command's output.
                if let (true, Some(step)) = (under_command, steps.last_mut()) {
                    step.shows.append(&mut comments);
                }
                under_command = false;
            }
        }
    }
    steps
}

/// A line as compared: no terminal escapes, no carriage returns, runs of
/// whitespace as one space.
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(if c == '\r' { ' ' } else { c });
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether some line of `output` holds the parts of `shown` (split at
/// `...`) in order.
fn shown_in(shown: &str, output: &str) -> bool {
    let parts: Vec<String> = shown.split("...").map(plain).filter(|p| !p.is_empty()).collect();
    output.lines().map(plain).any(|line| {
        let mut rest = line.as_str();
        parts.iter().all(|part| match rest.find(part.as_str()) {
            Some(at) => {
                rest = &rest[at + part.len()..];
                true
            }
            None => false,
        })
    })
}

/// Runs a section's commands as a user on a terminal does and checks each
/// against what the README shows. Skips where `script` is missing.
fn run_section(title: &str) {
    if Command::new("script").arg("--version").output().is_err() {
        eprintln!("SKIP: no `script` to make a terminal for the README's '{title}'");
        return;
    }
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let steps = steps(&section_blocks(&readme, title));
    assert!(!steps.is_empty(), "no commands in '{title}'");
    let tmp = tempfile::tempdir().unwrap();
    // A wide terminal, so that table rows are not cut to 80 columns.
    let mut script = String::from("stty cols 400 2>/dev/null\n");
    // The README's scratch folder, this test's own.
    let scratch = tmp.path().join("isorun-try").display().to_string();
    for (i, step) in steps.iter().enumerate() {
        let command = step.command.replace("/tmp/isorun-try", &scratch);
        script.push_str(&format!("echo '@@step {i}'\n{command}echo \"@@exit $?\"\n"));
    }
    let file = tmp.path().join("section.sh");
    std::fs::write(&file, script).unwrap();
    let top_level = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(repository())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let before = top_level();
    let path = format!("{}:{}", bin_dir().display(), std::env::var("PATH").unwrap_or_default());
    let output = Command::new("script")
        .args(["-qec", &format!("bash {}", file.display()), "/dev/null"])
        .current_dir(repository())
        .env("PATH", path)
        .env_remove("ISORUN_WORKER")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout).replace('\r', "");
    assert_eq!(top_level(), before, "README '{title}' wrote into the repository:\n{said}");
    for (i, step) in steps.iter().enumerate() {
        let start = said.find(&format!("@@step {i}\n")).unwrap_or_else(|| panic!("step {i} did not run:\n{said}"));
        let rest = &said[start..];
        let end = rest.find("@@exit ").unwrap_or_else(|| panic!("step {i} did not end:\n{rest}"));
        let printed = &rest[..end];
        let code: i32 = rest[end + 7..].lines().next().unwrap_or("").trim().parse().unwrap();
        let may_fail = step.said_before.iter().any(|line| line.contains("exit 1"));
        let expected = if may_fail { 1 } else { 0 };
        assert_eq!(code, expected, "README '{title}': {}printed:\n{printed}", step.command);
        for shown in &step.shows {
            assert!(
                shown_in(shown, printed),
                "README '{title}': {}shows\n  {shown}\nbut printed:\n{printed}",
                step.command
            );
        }
    }
}

#[test]
fn the_matcher_takes_dots_for_what_varies() {
    assert!(shown_in("classifier  ok  ...  2000 examples", "classifier  ok    0.5 s  299 MiB  2000 examples\n"));
    assert!(!shown_in("classifier  ok  ...  2001 examples", "classifier  ok    0.5 s  2000 examples\n"));
    assert!(!shown_in("b ... a", "a b\n"), "in order");
    let blocks = vec!["# about it\nisorun a \\\n  --b\n# shows\n\n# next\nisorun c\n# about d\nisorun d\n".to_string()];
    let parsed = steps(&blocks);
    assert_eq!(parsed.len(), 3);
    assert_eq!(parsed[0].command, "isorun a \\\n  --b\n");
    assert_eq!(
        (parsed[0].said_before.clone(), parsed[0].shows.clone()),
        (vec!["about it".into()], vec!["shows".into()])
    );
    assert_eq!((parsed[1].said_before.clone(), parsed[1].shows.len()), (vec!["next".into()], 0));
    assert_eq!((parsed[2].said_before.clone(), parsed[2].shows.len()), (vec!["about d".into()], 0));
}

#[test]
fn is_the_drop_real_runs_as_written() {
    run_section("Is the drop real?");
}

#[test]
fn json_lines_runs_as_written() {
    run_section("JSON Lines");
}

#[test]
fn parquet_and_arrow_run_as_written() {
    run_section("Evaluate on Parquet, Arrow and JSON Lines");
}

#[test]
fn onnx_models_run_as_written() {
    run_section("ONNX models");
}
