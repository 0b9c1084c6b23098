//! `isorun pipe`'s flags: one model kept in a worker, answering JSON Lines
//! requests from stdin.

use super::shared::{KerasArgs, SandboxMode, SpawnMode, WorkerArgs};
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
#[command(after_help = "Examples:
  printf '%s\\n' '{\"id\": 1, \"inputs\": {\"x\": [[1, 2, 3, 4]]}}' \\
      | isorun pipe models/linear

Exit codes: 0 end of input (or a closed stdout); 1 --max-restarts reached, or stdin unreadable;
2 usage error (the model cannot load; nothing read); 130/143 interrupted by Ctrl-C/SIGTERM,
even while waiting for a line (the worker is stopped first).")]
pub struct PipeArgs {
    /// The SavedModel folder to serve.
    #[arg(value_name = "MODEL")]
    pub model: PathBuf,

    /// Signature to run.
    #[arg(long, value_name = "KEY", default_value = "serving_default")]
    pub signature: String,

    /// Tag of the meta graph to load (repeat for a tag set).
    #[arg(long = "tag", value_name = "TAG", default_values_t = vec!["serve".to_string()])]
    pub tags: Vec<String>,

    /// Start a fresh worker after this many requests [default: never].
    #[arg(long, value_name = "N")]
    pub recycle_after: Option<u64>,

    /// Start a fresh worker when the worker's resident memory passes SIZE (e.g. 2G, 512M).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub recycle_rss: Option<u64>,

    /// Give up after this many worker crashes in a row.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub max_restarts: u32,

    /// Run up to N request lines that are already waiting as one batch (concatenated along the first
    /// dimension; each answer holds only its own rows). Requests that cannot be batched (other inputs or
    /// shapes, a signature with a fixed batch size, an output without a row per input row) run one by one.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_batch: u32,

    /// With --max-batch: how long to wait for more lines after the first, in microseconds [default: 0, only
    /// lines already waiting].
    #[arg(long, value_name = "MICROS", default_value_t = 0)]
    pub batch_wait: u64,

    /// Run each request's ops on the worker's serving thread instead of handing them to TensorFlow's inter-op
    /// pool (`inter_op_parallelism_threads` = -1; ops still use the intra-op pool). Spares a thread hand-off per
    /// request: 5x the requests/s on a tiny model here (BENCHMARKS.md). `false` for models with parallel branches.
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub ops_on_caller_thread: bool,

    /// After an answer, the worker polls for the next request, and after a request the supervisor polls for
    /// its answer, this many microseconds before sleeping: a sleeping process's wake-up is most of a tiny
    /// request's cost here (BENCHMARKS.md). 0 sleeps at once (no CPU spent waiting).
    #[arg(long, value_name = "MICROS", default_value_t = 50, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub spin_us: u32,

    /// Limit on each request, in seconds [default: none].
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub timeout: Option<f64>,

    /// Confine the worker (Landlock, no signals out, no UNIX sockets, no network, no new privileges, clean environment).
    #[arg(long, value_enum, value_name = "MODE", default_value = "strict", env = "ISORUN_SANDBOX")]
    pub sandbox: SandboxMode,

    /// How workers start: `auto` and `zygote` exec the first and fork every later one (after a crash or a
    /// recycle) from a zygote; `exec` execs each.
    #[arg(long, value_enum, value_name = "MODE", default_value = "auto", env = "ISORUN_SPAWN")]
    pub spawn: SpawnMode,

    #[command(flatten)]
    pub worker: WorkerArgs,

    #[command(flatten)]
    pub keras: KerasArgs,
}
