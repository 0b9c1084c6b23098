//! `isorun man [COMMAND]`: the man pages, one per command as git has them
//! (`isorun.1`, `isorun-run.1`, `isorun-report-diff.1`), generated from the
//! same clap definitions as `--help`, on stdout or installed with `--out-dir`.
//! A command's examples are a no-fill block, a line each as `--help` shows
//! them, and the page is never hyphenated: filled and hyphenated, an example
//! broke across lines as `accu‐racy>=0.9`, which does not copy and paste.

use crate::cli::{Cli, ManArgs};
use crate::error::CliError;
use crate::support::print_stdout;
use std::path::{Path, PathBuf};

/// One command's page: clap_mangen's sections without the after-help, which
/// [`Page::render`] adds as NOTES and EXAMPLES.
struct Page {
    man: clap_mangen::Man,
    after_help: Option<String>,
}

impl Page {
    fn new(command: &clap::Command) -> Page {
        let after_help = command.get_after_help().map(ToString::to_string);
        Page { man: clap_mangen::Man::new(command.clone().after_help(None::<&str>)), after_help }
    }

    fn get_filename(&self) -> String {
        self.man.get_filename()
    }

    /// The page as roff.
    fn render(&self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let mut page = Vec::new();
        self.man.render(&mut page)?;
        let page = String::from_utf8(page).map_err(std::io::Error::other)?;
        // Hyphenation off from the title on (clap_mangen's text is filled and hyphenated).
        let title_end = page.find(".TH ").and_then(|at| page[at..].find('\n').map(|n| at + n + 1)).unwrap_or(0);
        let sections = self.after_help.as_deref().map(after_help_sections).unwrap_or_default();
        let tail = page.find("\n.SH VERSION\n").map_or(page.len(), |at| at + 1);
        let roff = [&page[..title_end], ".nh\n", &page[title_end..tail], &sections, &page[tail..]].concat();
        out.extend_from_slice(roff.as_bytes());
        Ok(())
    }

    /// Writes the page into `dir` as its file name; its path.
    fn generate_to(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let path = dir.join(self.get_filename());
        let mut text = Vec::new();
        self.render(&mut text)?;
        std::fs::write(&path, text)?;
        Ok(path)
    }
}

/// A command's after-help as roff: its `Examples:` paragraph an EXAMPLES
/// section of no-fill lines, the other paragraphs NOTES (filled).
fn after_help_sections(text: &str) -> String {
    let mut notes = String::new();
    let mut examples = String::new();
    for paragraph in text.split("\n\n").filter(|p| !p.trim().is_empty()) {
        if let Some(lines) = paragraph.strip_prefix("Examples:\n") {
            examples.push_str(".nf\n");
            for line in lines.lines() {
                examples.push_str(&roff_text(line));
            }
            examples.push_str(".fi\n");
        } else {
            notes.push_str(".PP\n");
            for line in paragraph.lines() {
                notes.push_str(&roff_text(line));
            }
        }
    }
    let mut roff = String::new();
    if !notes.is_empty() {
        roff.push_str(".SH NOTES\n");
        roff.push_str(&notes);
    }
    if !examples.is_empty() {
        roff.push_str(".SH EXAMPLES\n");
        roff.push_str(&examples);
    }
    roff
}

/// One line of text as a roff text line, escaped as clap_mangen escapes:
/// backslashes and dashes, apostrophes as `\*(Aq` (its page defines it), a
/// leading period made text.
fn roff_text(line: &str) -> String {
    let escaped = line.replace('\\', "\\\\").replace('-', "\\-").replace('\'', "\\*(Aq");
    let lead = if escaped.starts_with('.') { "\\&" } else { "" };
    format!("{lead}{escaped}\n")
}

/// Every page: the top command's and each visible subcommand's, by page name.
fn pages() -> Vec<Page> {
    fn collect(command: &clap::Command, pages: &mut Vec<Page>) {
        pages.push(Page::new(command));
        for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
            collect(sub, pages);
        }
    }
    let mut command = <Cli as clap::CommandFactory>::command().disable_help_subcommand(true);
    // Building names each subcommand for its page (`isorun-run`, usage `isorun run`).
    command.build();
    let mut pages = Vec::new();
    collect(&command, &mut pages);
    pages
}

/// The page name of `isorun man report diff`: `isorun-report-diff`.
fn page_name(words: &[String]) -> String {
    let words: Vec<&str> = words.iter().flat_map(|w| w.split([' ', '-'])).filter(|w| !w.is_empty()).collect();
    let words = words.strip_prefix(&["isorun"]).unwrap_or(&words);
    std::iter::once("isorun").chain(words.iter().copied()).collect::<Vec<_>>().join("-")
}

/// Runs the command; `Err` is a usage error (exit 2).
pub fn main(args: &ManArgs) -> Result<i32, CliError> {
    let pages = pages();
    let name = |page: &Page| page.get_filename().trim_end_matches(".1").to_string();
    let chosen: Vec<&Page> = if args.command.is_empty() {
        if args.out_dir.is_some() {
            pages.iter().collect()
        } else {
            pages.iter().take(1).collect()
        }
    } else {
        let wanted = page_name(&args.command);
        let page = pages.iter().find(|p| name(p) == wanted).ok_or_else(|| {
            let names: Vec<String> =
                pages.iter().skip(1).map(|p| name(p)["isorun-".len()..].replace('-', " ")).collect();
            format!("no man page for '{}'; commands are: {}", args.command.join(" "), names.join(", "))
        })?;
        vec![page]
    };
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("--out-dir {}: cannot create: {e}", dir.display()))?;
        let mut written = String::new();
        for page in chosen {
            let path = page.generate_to(dir).map_err(|e| format!("--out-dir {}: cannot write: {e}", dir.display()))?;
            written.push_str(&format!("{}\n", path.display()));
        }
        return Ok(print_stdout(written.as_bytes())?);
    }
    let mut text = Vec::new();
    for page in chosen {
        page.render(&mut text).map_err(|e| e.to_string())?;
    }
    Ok(print_stdout(&text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_has_a_page_named_as_git_names_them() {
        let names: Vec<String> = pages().iter().map(|p| p.get_filename()).collect();
        for expected in ["isorun.1", "isorun-run.1", "isorun-eval.1", "isorun-report-diff.1", "isorun-cache-ls.1"] {
            assert!(names.iter().any(|n| n == expected), "{expected} not in {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("help")), "{names:?}");
        assert_eq!(page_name(&["run".into()]), "isorun-run");
        assert_eq!(page_name(&["report".into(), "diff".into()]), "isorun-report-diff");
        assert_eq!(page_name(&["isorun-report-diff".into()]), "isorun-report-diff");
    }
}
