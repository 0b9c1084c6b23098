//! `isorun man [COMMAND]`: the man pages, one per command as git has them
//! (`isorun.1`, `isorun-run.1`, `isorun-report-diff.1`), generated from the
//! same clap definitions as `--help`, on stdout or installed with `--out-dir`.

use crate::cli::{Cli, ManArgs};
use crate::support::print_stdout;

/// Every page: the top command's and each visible subcommand's, by page name.
fn pages() -> Vec<clap_mangen::Man> {
    fn collect(command: &clap::Command, pages: &mut Vec<clap_mangen::Man>) {
        pages.push(clap_mangen::Man::new(command.clone()));
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
pub fn main(args: &ManArgs) -> Result<i32, String> {
    let pages = pages();
    let name = |page: &clap_mangen::Man| page.get_filename().trim_end_matches(".1").to_string();
    let chosen: Vec<&clap_mangen::Man> = if args.command.is_empty() {
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
        return print_stdout(written.as_bytes());
    }
    let mut text = Vec::new();
    for page in chosen {
        page.render(&mut text).map_err(|e| e.to_string())?;
    }
    print_stdout(&text)
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
