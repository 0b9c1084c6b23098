//! `isorun map`'s flags: a user's Python function called on each item, each
//! call in a supervised process forked from a warm zygote.

use super::shared::{Format, SandboxMode};
use clap::Args;
use std::path::PathBuf;

/// `isorun map`: a user's Python function, one supervised process per call.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  isorun map mymodule:evaluate models/a models/b   # a JSON line per call
  ls models/ | isorun map evaluate.py:evaluate --items-from - -j 2 \\
      --timeout 600 --memory-limit 8G
  isorun map jobs:score '{\"n\": 3}' --journal map.jsonl --resume

Each ITEM that starts like JSON ({, [, \", true, false, null) must be JSON (the call gets it as
Python's json reads it); one that starts with a digit or - is a number where it is one (12, -3.5,
1e999), else a string, as is any other ITEM (a path: 3d.txt, a date: 2024-01-01). A record's \"value\" is the
return value as JSON; when it is not JSON or passes 1 MiB it is left out and \"value_omitted\" says
\"not JSON\" or \"over 1 MiB\" (\"value_type\" still names its type). The function's module is
imported once by a zygote per slot (with OPENBLAS_NUM_THREADS=1 and the like, restored for each
call); each call runs in a process forked from it, confined by the sandbox (read what you can,
write beneath --writable folders only, no network unless --network).
Exit codes: 0 every call ok; 1 some call not ok; 2 usage error (nothing run),
or an output file (--report, --junit, --html, --journal) another isorun is
writing; 130/143 interrupted by Ctrl-C/SIGTERM.")]
pub struct MapArgs {
    /// The function: MODULE:FUNCTION, MODULE a dotted module importable from here or a .py file.
    #[arg(value_name = "MODULE:FUNCTION")]
    pub target: String,

    /// Items to call the function on, one call each (JSON, else a plain string).
    #[arg(value_name = "ITEM")]
    pub items: Vec<String>,

    /// Read items from FILE, one per line (- for stdin; empty lines skipped), after the ITEM arguments.
    #[arg(long, value_name = "FILE|-", help_heading = "Inputs")]
    pub items_from: Option<PathBuf>,

    /// Each --items-from line is {\"file\": PATH, \"repr\": STRING}: PATH holds the pickled item (for the Python API).
    #[arg(long, requires = "items_from", hide = true)]
    pub items_pickled: bool,

    /// The function by value: a pickle (cloudpickle) of it; MODULE:FUNCTION then only names it (for the Python API).
    #[arg(long, value_name = "FILE", hide = true)]
    pub function_pickle: Option<PathBuf>,

    /// Pickle every ok call's value (protocol 5) into DIR/<index>.pkl; records say \"value_file\" (for the Python API).
    #[arg(long, value_name = "DIR", hide = true)]
    pub values_dir: Option<PathBuf>,

    /// The Python to run the function with (default: the environment isorun is installed in, else python3 on PATH).
    #[arg(long, value_name = "PATH", env = "ISORUN_PYTHON", help_heading = "Python")]
    pub python: Option<PathBuf>,

    /// Modules the zygote imports before forking, besides the function's own module (comma-separated, repeatable).
    #[arg(long, value_name = "MOD[,MOD..]", value_delimiter = ',', help_heading = "Python")]
    pub preload: Vec<String>,

    /// Largest pickled value a call may hand back to the Python API (e.g. 512M); a larger one is the call's error (value_too_large), its writing stopped at SIZE.
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = crate::size::parse_size, help_heading = "Python")]
    pub value_cap: u64,

    /// Calls running at once [default: number of CPUs].
    #[arg(short, long, value_name = "N", env = "ISORUN_JOBS", help_heading = "Workers")]
    pub jobs: Option<usize>,

    /// Items each forked process runs in turn before it exits (a module global one call changes is then seen by
    /// the next calls of that process); a call that crashes, times out or hits the limit ends the process, and
    /// the items after it go to a fresh one.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u64).range(1..),
        help_heading = "Workers"
    )]
    pub items_per_worker: u64,

    /// Processes forked ahead per slot, each waiting for the slot's next item, so that a fork is never waited
    /// for (0 turns them off; at most 1).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = clap::value_parser!(u64).range(0..=1),
        help_heading = "Workers"
    )]
    pub spares: u64,

    /// Limit on each call, in seconds [default: none].
    #[arg(
        long,
        value_name = "SECONDS",
        env = "ISORUN_TIMEOUT",
        allow_negative_numbers = true,
        help_heading = "Workers"
    )]
    pub timeout: Option<f64>,

    /// Limit on a zygote's start (its imports), in seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 300.0,
        allow_negative_numbers = true,
        help_heading = "Workers"
    )]
    pub start_timeout: f64,

    /// Stop a call whose private memory (RssAnon + RssShmem) passes SIZE (e.g. 2G, 512M; a bare number is bytes, at least 16 MiB).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_memory_limit, help_heading = "Workers")]
    pub memory_limit: Option<u64>,

    /// Confine the zygote and its calls (Landlock: writes only beneath --writable, the values folder and a private
    /// temporary folder; no network; no signals out; no new UNIX sockets; no new privileges).
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        default_value = "strict",
        env = "ISORUN_SANDBOX",
        help_heading = "Workers"
    )]
    pub sandbox: SandboxMode,

    /// A folder calls may write beneath (repeatable).
    #[arg(long, value_name = "DIR", help_heading = "Workers")]
    pub writable: Vec<PathBuf>,

    /// Let calls use the network.
    #[arg(long, help_heading = "Workers")]
    pub network: bool,

    /// GPUs, comma-separated (0,1 or UUIDs): slot i's calls get CUDA_VISIBLE_DEVICES set to entry i mod n
    /// before the function runs [default: CUDA_VISIBLE_DEVICES as it is].
    #[arg(long, value_name = "LIST", value_delimiter = ',', help_heading = "GPUs")]
    pub gpus: Vec<String>,

    /// Run a call again up to N times when it crashes, times out, hits the memory limit or cannot start.
    #[arg(long, value_name = "N", default_value_t = 0, help_heading = "Nightly")]
    pub retries: u32,

    /// Statuses that are retried (comma-separated).
    #[arg(
        long,
        value_name = "STATUSES",
        value_delimiter = ',',
        default_value = "crashed,timeout,memory_limit,protocol_error,spawn_failed",
        help_heading = "Nightly"
    )]
    pub retry_on: Vec<String>,

    /// Append one JSON line per finished call to PATH (fsynced), for --resume.
    #[arg(long, value_name = "PATH", help_heading = "Nightly")]
    pub journal: Option<PathBuf>,

    /// Skip calls already in the journal with the same function (name and source) and item.
    #[arg(long, requires = "journal", help_heading = "Nightly")]
    pub resume: bool,

    /// Run only shard K of N (K from 0): the items whose name (as reports show it) hashes to K, as
    /// `run --shard` shards models (FNV-1a 64 mod N). `isorun slurm submit map` sets it per task.
    #[arg(long, value_name = "K/N", value_parser = isorun_report::shard::parse_shard, help_heading = "Nightly")]
    pub shard: Option<isorun_report::shard::Shard>,

    /// Write a JSON report of the whole run (one unit per item).
    #[arg(long, value_name = "PATH.json", help_heading = "Nightly")]
    pub report: Option<PathBuf>,

    /// Write a JUnit XML report (one test case per item).
    #[arg(long, value_name = "PATH.xml", help_heading = "Nightly")]
    pub junit: Option<PathBuf>,

    /// Write a self-contained HTML report.
    #[arg(long, value_name = "PATH.html", help_heading = "Nightly")]
    pub html: Option<PathBuf>,

    /// Output format on stdout [default: table on a terminal, jsonl otherwise].
    #[arg(long, value_enum, value_name = "FORMAT", help_heading = "Outputs")]
    pub format: Option<Format>,

    /// Short for --format jsonl.
    #[arg(long, conflicts_with = "format", help_heading = "Outputs")]
    pub json: bool,
}
