//! `isorun run --config nightly.toml` (and `isorun eval --config
//! eval.toml`, whose keys are run's and eval's own: `data`, `label`,
//! `metric`, `baseline`, ...): the settings of a run kept in a TOML file, so
//! a nightly job is a reviewed file rather than a long command line.
//!
//! The file is turned into command-line arguments before clap sees anything,
//! so clap stays the one parser and validator of every setting, and the keys
//! are read off clap's definition of `run`: a new flag gets a key without a
//! change here. A key is the long flag name without `--` (`models-per-worker`,
//! or `models_per_worker`), plus `models` for the MODEL arguments; hidden
//! flags, `help`, `version` and `config` itself have none. Values by the
//! kind of flag:
//!
//! - switches (`values`, `json`, `resume`, `quiet`, ...): `true` passes the
//!   flag, `false` leaves it out; `verbose` also takes a count (`verbose = 2`);
//! - numbers (`jobs`, `timeout`, `retries`, ...): a TOML integer, or a float
//!   where the flag takes seconds or a tolerance; a string where the flag
//!   itself accepts it (`memory-limit = "2G"`);
//! - everything else (`signature`, `format`, `shard`, paths): a string;
//! - repeatable flags (`models`, `input`, `inputs`, `tag`, `load-library`,
//!   `retry-on`, `fail-on`): an array, or one value; comma-separated flags
//!   get one flag per element.
//!
//! Paths are relative to the file's folder, not to the current directory:
//! every key whose flag takes a path (`models`, `inputs`, `inputs-dir`,
//! `load-library`, `output-dir`, `journal`, `expect`, `report`, `junit`,
//! `html`, `worker`, `libtensorflow-dir`), and the PATH of `input =
//! "NAME=PATH"` (not `NAME=@JSON`). `-` (stdin) is kept as it is, `~` is not
//! expanded. `models` entries may be globs (`models/*/saved_model_dir`):
//! `*`, `?` and `[...]` within one path component, `**` for any number of
//! folders; names starting with `.` match only a pattern starting with `.`.
//! A glob matches folders only (a MODEL is a folder), sorted bytewise; a
//! glob that matches nothing is an error.
//!
//! Precedence: command line, then environment (`ISORUN_JOBS`, ...), then the
//! file, then clap's defaults. A flag given on the command line (or its
//! variable in the environment) drops the file's key entirely, a repeatable
//! one too (`--input` replaces every `input` of the file), and so does a flag
//! that conflicts with the key (`--json` drops `format`). Without that, clap
//! would see a single-valued flag twice and refuse it.
//!
//! Every problem with the file is a usage error naming the file and the line:
//! `nightly.toml:7: unknown key 'timeout_secs' (did you mean 'timeout'?)`.

use clap::builder::Resettable;
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command, CommandFactory};
use std::any::TypeId;
use std::ffi::OsString;
use std::fmt;
use std::path::{Component, Path, PathBuf};
use toml_edit::{ImDocument, Item, Value};

/// The subcommands with `--config`: `run`, and `eval`, which has every
/// flag of `run` and its own (`data`, `label`, `metric`, ...).
const SUBCOMMANDS: [&str; 2] = ["run", "eval"];
/// The id of `--config` in [`crate::cli::SharedRunArgs`] (of `run` and `eval`).
const CONFIG_ID: &str = "config";

/// A place in the config file: `nightly.toml:7`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: PathBuf,
    pub line: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// Why a config file cannot be used; each is a usage error (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}:{column}: invalid TOML: {message}", file.display())]
    Syntax { file: PathBuf, line: usize, column: usize, message: String },
    #[error("{at}: unknown key '{key}'{}", suggestion.as_ref().map(|s| format!(" (did you mean '{s}'?)")).unwrap_or_default())]
    UnknownKey { at: Location, key: String, suggestion: Option<String> },
    #[error("{at}: '{key}' cannot be set in a config file")]
    NotInFile { at: Location, key: String },
    #[error("{at}: table '{name}' is not supported: settings are top-level keys")]
    Table { at: Location, name: String },
    #[error("{at}: '{key}' is the same key as '{first}' on line {first_line}")]
    Duplicate { at: Location, key: String, first: String, first_line: usize },
    #[error("{at}: {key}: expected {expected}, found {found}")]
    WrongType { at: Location, key: String, expected: String, found: String },
    #[error("{at}: {key} = {value}: {reason}")]
    InvalidValue { at: Location, key: String, value: String, reason: String },
    #[error("{at}: '{key}' cannot be used with '{other}' (line {other_line})")]
    Conflict { at: Location, key: String, other: String, other_line: usize },
    #[error("{at}: models: '{pattern}' matches nothing")]
    NoMatch { at: Location, pattern: String },
}

/// The command line with the config file's settings put in: `raw` itself
/// unless it is `isorun ... run ... --config PATH`. Anything clap would
/// refuse on the command line is left for clap to report.
pub fn expand_command_line(raw: Vec<OsString>) -> Result<Vec<OsString>, ConfigError> {
    let Ok(matches) = relaxed_cli(true).try_get_matches_from(&raw) else { return Ok(raw) };
    let Some((subcommand, run_matches)) = matches.subcommand() else { return Ok(raw) };
    let Some(subcommand) = SUBCOMMANDS.into_iter().find(|s| *s == subcommand) else { return Ok(raw) };
    let Some(path) = run_matches.get_one::<PathBuf>(CONFIG_ID).cloned() else { return Ok(raw) };
    let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
    let given = |id: &str| given_outside_file(&matches, run_matches, id);
    let file_args = file_arguments(subcommand, &path, &text, &given)?;
    // Global flags take no values, so the first `run` (or `eval`) is the subcommand.
    let run_index = raw.iter().skip(1).position(|arg| arg == subcommand).map_or(raw.len(), |i| i + 1);
    let mut args = raw;
    let tail = args.split_off((run_index + 1).min(args.len()));
    args.extend(file_args);
    args.extend(tail);
    Ok(args)
}

/// The arguments the file at `path` (holding `text`) stands for, to go right
/// after `run`, leaving out every key for which `given(clap id)` says the
/// command line or the environment has a value.
fn file_arguments(
    subcommand: &'static str,
    path: &Path,
    text: &str,
    given: &dyn Fn(&str) -> bool,
) -> Result<Vec<OsString>, ConfigError> {
    let keys = known_keys(subcommand);
    let validator = relaxed_cli(false);
    let base = path.parent().unwrap_or(Path::new(""));
    let at = |line| Location { file: path.to_path_buf(), line };

    let document = ImDocument::parse(text).map_err(|e| {
        let (line, column) = e.span().map_or((1, 1), |span| line_column(text, span.start));
        let message = e.message().trim().replace('\n', "; ");
        ConfigError::Syntax { file: path.to_path_buf(), line, column, message }
    })?;
    let table = document.as_table();
    let mut entries: Vec<(&toml_edit::Key, &Item)> =
        table.iter().filter_map(|(name, _)| table.get_key_value(name)).collect();
    entries.sort_by_key(|(key, item)| key.span().or_else(|| item.span()).map_or(usize::MAX, |s| s.start));

    // Every key is checked, the ones the command line overrides too: a broken
    // file is broken whatever the command line says.
    let mut settings: Vec<Setting> = Vec::new();
    for (key, item) in entries {
        let line = key.span().or_else(|| item.span()).map_or(1, |s| line_of(text, s.start));
        let written = key.get();
        if matches!(item, Item::Table(_) | Item::ArrayOfTables(_)) {
            return Err(ConfigError::Table { at: at(line), name: written.to_string() });
        }
        let normalized = written.replace('_', "-");
        let Some(spec) = keys.iter().find(|k| k.name == normalized) else {
            if normalized == CONFIG_ID {
                return Err(ConfigError::NotInFile { at: at(line), key: written.to_string() });
            }
            let suggestion = suggest(&normalized, keys.iter().map(|k| k.name.as_str())).map(str::to_string);
            return Err(ConfigError::UnknownKey { at: at(line), key: written.to_string(), suggestion });
        };
        if let Some(first) = settings.iter().find(|s| s.spec.name == spec.name) {
            return Err(ConfigError::Duplicate {
                at: at(line),
                key: written.to_string(),
                first: first.written.clone(),
                first_line: first.line,
            });
        }
        let Some(value) = item.as_value() else {
            return Err(ConfigError::WrongType {
                at: at(line),
                key: written.to_string(),
                expected: spec.expected(),
                found: "nothing".into(),
            });
        };
        let values = spec.values(value, written, text, &at(line), &validator)?;
        settings.push(Setting { spec, written: written.to_string(), line, values });
    }

    settings.retain(|s| !given(&s.spec.id) && !s.spec.conflicts.iter().any(|c| given(c)));
    let passed: Vec<&Setting> = settings.iter().filter(|s| !s.values.is_empty()).collect();
    for (i, setting) in passed.iter().enumerate() {
        if let Some(other) = passed[..i].iter().find(|o| setting.spec.conflicts.contains(&o.spec.id)) {
            return Err(ConfigError::Conflict {
                at: at(setting.line),
                key: setting.written.clone(),
                other: other.written.clone(),
                other_line: other.line,
            });
        }
    }

    let mut args = Vec::new();
    for setting in &settings {
        for (value, line) in &setting.values {
            args.extend(setting.spec.arguments(value, base, &at(*line))?);
        }
    }
    Ok(args)
}

/// One key of the file, checked, with its values as clap would take them
/// from the command line (paths still as written) and the line of each.
struct Setting<'a> {
    spec: &'a KeySpec,
    written: String,
    line: usize,
    values: Vec<(FileValue, usize)>,
}

/// One value of a key.
#[derive(Debug, Clone, PartialEq)]
enum FileValue {
    /// A switch given (`true`), or one occurrence of a counted flag.
    Present,
    Text(String),
}

/// How many values a flag takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// On or off: `--values`.
    Switch,
    /// Given N times: `-vv`.
    Count,
    /// One value.
    Single,
    /// Repeatable (`--input`), comma-separated (`--retry-on`) or positional (MODEL...).
    List,
}

/// What a flag's value is, read from the type its value parser makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Unsigned,
    Signed,
    Float,
    Bool,
    /// A path, relative to the config file's folder.
    Path,
    /// `NAME=PATH`, PATH relative to the config file's folder unless it is `@JSON`.
    NamedPath,
    Text,
}

/// A key of the file: one argument of `isorun run`.
#[derive(Debug, Clone)]
struct KeySpec {
    /// The key as documented: the long flag, or the positional's id.
    name: String,
    /// clap's id, as in [`ArgMatches`].
    id: String,
    /// `--long`; `None` for the positional MODEL.
    long: Option<String>,
    shape: Shape,
    kind: Kind,
    /// The values a value enum allows (`format`).
    choices: Vec<String>,
    /// Ids of the arguments that cannot be given with this one (both ways).
    conflicts: Vec<String>,
    /// The subcommand whose flag it is (`run`, `eval`).
    subcommand: &'static str,
}

/// The keys of the file: every visible argument of `isorun run`, its global
/// flags included, in clap's order.
fn known_keys(subcommand: &'static str) -> Vec<KeySpec> {
    let mut cli = crate::cli::Cli::command();
    cli.build();
    let run = cli.find_subcommand(subcommand).expect("isorun has the subcommand");
    let arguments: Vec<&Arg> = run
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !["help", "version", CONFIG_ID].contains(&a.get_id().as_str()))
        .collect();
    let conflicts_of = |arg: &Arg| -> Vec<String> {
        let mut ids: Vec<String> = run.get_arg_conflicts_with(arg).iter().map(|a| a.get_id().to_string()).collect();
        for other in run.get_arguments() {
            if run.get_arg_conflicts_with(other).iter().any(|a| a.get_id() == arg.get_id()) {
                ids.push(other.get_id().to_string());
            }
        }
        ids.sort();
        ids.dedup();
        ids
    };
    arguments
        .iter()
        .map(|arg| {
            let long = arg.get_long().map(str::to_string);
            let name = long.clone().unwrap_or_else(|| arg.get_id().as_str().replace('_', "-"));
            let shape = match arg.get_action() {
                ArgAction::SetTrue | ArgAction::SetFalse => Shape::Switch,
                ArgAction::Count => Shape::Count,
                ArgAction::Append => Shape::List,
                _ => Shape::Single,
            };
            KeySpec {
                subcommand,
                name,
                id: arg.get_id().to_string(),
                long,
                shape,
                kind: kind_of(arg),
                choices: arg.get_possible_values().iter().map(|v| v.get_name().to_string()).collect(),
                conflicts: conflicts_of(arg),
            }
        })
        .collect()
}

/// What `arg` takes: `NAME=PATH` by its value name, the rest by the type
/// its value parser makes (a custom parser's type too: `--memory-limit`
/// makes a `u64` from `2G`).
fn kind_of(arg: &Arg) -> Kind {
    let parsed = arg.get_value_parser().type_id();
    let is_one_of = |ids: &[TypeId]| ids.iter().any(|id| parsed == *id);
    let unsigned =
        [TypeId::of::<u8>(), TypeId::of::<u16>(), TypeId::of::<u32>(), TypeId::of::<u64>(), TypeId::of::<usize>()];
    let signed =
        [TypeId::of::<i8>(), TypeId::of::<i16>(), TypeId::of::<i32>(), TypeId::of::<i64>(), TypeId::of::<isize>()];
    if arg.get_value_names().is_some_and(|names| names.iter().any(|n| n.as_str().ends_with("=PATH"))) {
        Kind::NamedPath
    } else if is_one_of(&[TypeId::of::<PathBuf>()]) {
        Kind::Path
    } else if is_one_of(&unsigned) {
        Kind::Unsigned
    } else if is_one_of(&signed) {
        Kind::Signed
    } else if is_one_of(&[TypeId::of::<f32>(), TypeId::of::<f64>()]) {
        Kind::Float
    } else if is_one_of(&[TypeId::of::<bool>()]) {
        Kind::Bool
    } else {
        Kind::Text
    }
}

impl KeySpec {
    /// What the key takes, for error messages.
    fn expected(&self) -> String {
        let one = match (self.shape, self.kind) {
            (Shape::Switch, _) => return "true or false".into(),
            (Shape::Count, _) => return "true, false or a count from 0 to 255".into(),
            (_, _) if !self.choices.is_empty() => {
                format!("one of {}", self.choices.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>().join(", "))
            }
            (_, Kind::Unsigned) => "a non-negative integer".into(),
            (_, Kind::Signed) => "an integer".into(),
            (_, Kind::Float) => "a number".into(),
            (_, Kind::Bool) => "true or false".into(),
            (_, Kind::Path) => "a path (a string)".into(),
            (_, Kind::NamedPath | Kind::Text) => "a string".into(),
        };
        match self.shape {
            Shape::List => format!("{one}, or an array of them"),
            _ => one,
        }
    }

    /// The values `value` stands for, each checked by the flag's own value
    /// parser, with the line of each.
    fn values(
        &self,
        value: &Value,
        written: &str,
        text: &str,
        at: &Location,
        validator: &Command,
    ) -> Result<Vec<(FileValue, usize)>, ConfigError> {
        let wrong = |found: &Value, line: usize| ConfigError::WrongType {
            at: Location { line, ..at.clone() },
            key: written.to_string(),
            expected: self.expected(),
            found: describe(found),
        };
        match self.shape {
            Shape::Switch => match value {
                Value::Boolean(b) if *b.value() => Ok(vec![(FileValue::Present, at.line)]),
                Value::Boolean(_) => Ok(Vec::new()),
                _ => Err(wrong(value, at.line)),
            },
            Shape::Count => match value {
                Value::Boolean(b) => Ok(if *b.value() { vec![(FileValue::Present, at.line)] } else { Vec::new() }),
                Value::Integer(n) if (0..=i64::from(u8::MAX)).contains(n.value()) => {
                    Ok(vec![(FileValue::Present, at.line); *n.value() as usize])
                }
                _ => Err(wrong(value, at.line)),
            },
            Shape::Single => {
                if value.is_array() {
                    return Err(wrong(value, at.line));
                }
                Ok(vec![(
                    self.scalar(value, written, at, validator)
                        .map_err(|e| e.unwrap_or_else(|| wrong(value, at.line)))?,
                    at.line,
                )])
            }
            Shape::List => {
                let elements: Vec<&Value> = match value {
                    Value::Array(array) => array.iter().collect(),
                    other => vec![other],
                };
                elements
                    .into_iter()
                    .map(|element| {
                        let line = element.span().map_or(at.line, |s| line_of(text, s.start));
                        let here = Location { line, ..at.clone() };
                        if element.is_array() {
                            return Err(wrong(element, line));
                        }
                        let value = self
                            .scalar(element, written, &here, validator)
                            .map_err(|e| e.unwrap_or_else(|| wrong(element, line)))?;
                        Ok((value, line))
                    })
                    .collect()
            }
        }
    }

    /// One value as text, checked by clap. `Err(None)`: a value of the wrong
    /// type (the caller says which); `Err(Some(..))`: the flag refuses it.
    fn scalar(
        &self,
        value: &Value,
        written: &str,
        at: &Location,
        validator: &Command,
    ) -> Result<FileValue, Option<ConfigError>> {
        let text = match (self.kind, value) {
            (Kind::Unsigned | Kind::Signed | Kind::Float, Value::Integer(n)) => n.value().to_string(),
            (Kind::Float, Value::Float(x)) => x.value().to_string(),
            (Kind::Bool, Value::Boolean(b)) => b.value().to_string(),
            // A number flag with a parser of its own may take text (`memory-limit = "2G"`).
            (_, Value::String(s)) => s.value().clone(),
            _ => return Err(None),
        };
        match self.check(&text, validator) {
            Ok(()) => Ok(FileValue::Text(text)),
            Err(error) => {
                let numeric = matches!(self.kind, Kind::Unsigned | Kind::Signed | Kind::Float | Kind::Bool);
                let cause = std::error::Error::source(&error);
                // Not a number at all (`"two"`, or `-1` for a count) is a
                // wrong type; too large or out of the flag's range is a bad value.
                let not_a_number = cause.is_none_or(|c| {
                    c.downcast_ref::<std::num::ParseIntError>().is_some_and(|e| {
                        matches!(e.kind(), std::num::IntErrorKind::InvalidDigit | std::num::IntErrorKind::Empty)
                    }) || c.is::<std::num::ParseFloatError>()
                        || c.is::<std::str::ParseBoolError>()
                });
                if numeric && not_a_number {
                    return Err(None);
                }
                let reason = match cause {
                    Some(cause) => cause.to_string(),
                    None if !self.choices.is_empty() => format!("expected {}", self.expected()),
                    None => clap_reason(&error),
                };
                Err(Some(ConfigError::InvalidValue {
                    at: at.clone(),
                    key: written.to_string(),
                    value: shown(value),
                    reason,
                }))
            }
        }
    }

    /// Runs `text` through this flag's value parser.
    fn check(&self, text: &str, validator: &Command) -> Result<(), clap::Error> {
        let argument = match &self.long {
            Some(long) => OsString::from(format!("--{long}={text}")),
            // A value starting with `-` would read as a flag.
            None if text.starts_with('-') => return Ok(()),
            None => OsString::from(text),
        };
        validator.clone().try_get_matches_from([OsString::from("isorun"), self.subcommand.into(), argument]).map(drop)
    }

    /// The command-line arguments for one checked value.
    fn arguments(&self, value: &FileValue, base: &Path, at: &Location) -> Result<Vec<OsString>, ConfigError> {
        let text = match value {
            FileValue::Present => {
                return Ok(vec![OsString::from(format!("--{}", self.long.as_deref().unwrap_or(&self.name)))])
            }
            FileValue::Text(text) => text,
        };
        let values: Vec<OsString> = match self.kind {
            Kind::Path if self.long.is_none() => {
                let resolved = resolve(base, text);
                if has_glob(text) {
                    let found = glob(base, Path::new(text));
                    if found.is_empty() && !resolved.exists() {
                        return Err(ConfigError::NoMatch { at: at.clone(), pattern: text.clone() });
                    }
                    if found.is_empty() {
                        vec![resolved.into_os_string()]
                    } else {
                        found.into_iter().map(PathBuf::into_os_string).collect()
                    }
                } else {
                    vec![resolved.into_os_string()]
                }
            }
            Kind::Path => vec![resolve(base, text).into_os_string()],
            Kind::NamedPath => match text.split_once('=') {
                Some((name, path)) if !path.starts_with('@') && !path.is_empty() => {
                    let mut pair = OsString::from(format!("{name}="));
                    pair.push(resolve(base, path));
                    vec![pair]
                }
                _ => vec![OsString::from(text)],
            },
            _ => vec![OsString::from(text)],
        };
        Ok(values
            .into_iter()
            .map(|value| match &self.long {
                Some(long) => {
                    let mut argument = OsString::from(format!("--{long}="));
                    argument.push(value);
                    argument
                }
                // A MODEL starting with `-` would read as a flag.
                None if value.to_string_lossy().starts_with('-') => Path::new(".").join(value).into_os_string(),
                None => value,
            })
            .collect())
    }
}

/// `isorun` with nothing required, so the command line can be read when the
/// file is what gives MODEL or `--journal`; `keep_env: false` for checking
/// one value alone, whatever the environment says.
fn relaxed_cli(keep_env: bool) -> Command {
    let relax = move |arg: Arg| {
        let arg = arg.required(false).requires(Resettable::<clap::Id>::Reset);
        if keep_env {
            arg
        } else {
            arg.env(None)
        }
    };
    SUBCOMMANDS.into_iter().fold(crate::cli::Cli::command().mut_args(relax), |cli, name| {
        cli.mut_subcommand(name, |sub| sub.mut_args(relax))
    })
}

/// True when `id` has a value from the command line or the environment.
fn given_outside_file(top: &ArgMatches, run: &ArgMatches, id: &str) -> bool {
    let from_outside = |m: &ArgMatches| {
        m.ids().any(|i| i.as_str() == id)
            && matches!(m.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable))
    };
    from_outside(run) || from_outside(top)
}

/// The first line of clap's message, without `error: `.
fn clap_reason(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first = rendered.lines().find(|l| !l.trim().is_empty()).unwrap_or_default();
    first.trim().trim_start_matches("error: ").to_string()
}

/// A TOML value as written, for messages.
fn shown(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{:?}", s.value()),
        other => other.clone().decorated("", "").to_string(),
    }
}

/// What a TOML value is, for messages: `string "two"`, `integer 3`.
fn describe(value: &Value) -> String {
    match value {
        Value::String(_) => format!("string {}", shown(value)),
        Value::Integer(_) => format!("integer {}", shown(value)),
        Value::Float(_) => format!("float {}", shown(value)),
        Value::Boolean(_) => format!("boolean {}", shown(value)),
        Value::Datetime(_) => format!("date-time {}", shown(value)),
        Value::Array(_) => "an array".into(),
        Value::InlineTable(_) => "a table".into(),
    }
}

/// `path` relative to the config file's folder; `-` (stdin) stays.
fn resolve(base: &Path, path: &str) -> PathBuf {
    if path == "-" {
        PathBuf::from(path)
    } else {
        base.join(path)
    }
}

/// 1-based line of byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    line_column(text, offset).0
}

/// 1-based line and column (in characters) of byte `offset`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or_default().chars().count() + 1;
    (line, column)
}

/// The known key closest to `unknown` by edit distance, when it is close:
/// within a third of the length (at least 2), or when one is a prefix of the
/// other (`timeout_secs` -> `timeout`).
fn suggest<'a>(unknown: &str, known: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let unknown = unknown.to_ascii_lowercase().replace('_', "-");
    let limit = (unknown.chars().count() / 3).max(2);
    known
        .filter_map(|name| {
            let distance = edit_distance(&unknown, name);
            let prefix = name.len() >= 3 && (unknown.starts_with(name) || name.starts_with(&unknown));
            (distance <= limit || prefix).then_some((distance, name))
        })
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, name)| name)
}

/// Levenshtein distance, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    strsim::levenshtein(a, b)
}

// ---------------------------------------------------------------------------
// Globs

fn has_glob(text: &str) -> bool {
    text.contains(['*', '?', '['])
}

/// The folders `pattern` matches under `base` (taken literally), sorted
/// bytewise: a MODEL is a folder, so a file next to the models (a README,
/// the config file itself) is no match. Unreadable folders match nothing,
/// as in a shell.
fn glob(base: &Path, pattern: &Path) -> Vec<PathBuf> {
    let mut candidates = vec![base.to_path_buf()];
    for component in pattern.components() {
        let part = match component {
            Component::Normal(part) => part,
            other => {
                candidates.iter_mut().for_each(|c| c.push(other.as_os_str()));
                continue;
            }
        };
        let Some(part) = part.to_str().filter(|p| has_glob(p)) else {
            candidates.iter_mut().for_each(|c| c.push(part));
            continue;
        };
        let mut next = Vec::new();
        for candidate in &candidates {
            if part == "**" {
                next.push(candidate.clone());
                descendant_folders(candidate, &mut next);
                continue;
            }
            let folder = if candidate.as_os_str().is_empty() { Path::new(".") } else { candidate.as_path() };
            let Ok(entries) = std::fs::read_dir(folder) else { continue };
            for entry in entries.flatten() {
                let name = entry.file_name();
                if name.to_str().is_some_and(|name| glob_match(part, name)) {
                    next.push(candidate.join(name));
                }
            }
        }
        candidates = next;
    }
    let mut found: Vec<PathBuf> = candidates.into_iter().filter(|p| p.is_dir()).collect();
    found.sort_by(|a, b| a.as_os_str().as_encoded_bytes().cmp(b.as_os_str().as_encoded_bytes()));
    found.dedup();
    found
}

/// Every folder under `folder`, not through symbolic links, not hidden ones.
fn descendant_folders(folder: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(if folder.as_os_str().is_empty() { Path::new(".") } else { folder }) else {
        return;
    };
    for entry in entries.flatten() {
        let hidden = entry.file_name().as_encoded_bytes().starts_with(b".");
        if !hidden && entry.file_type().is_ok_and(|t| t.is_dir()) {
            let path = folder.join(entry.file_name());
            found.push(path.clone());
            descendant_folders(&path, found);
        }
    }
}

/// Whether `name` (one path component) matches `pattern`: `*` any run of
/// characters, `?` one, `[abc]`, `[a-z]`, `[!a]` / `[^a]` one of a set
/// (`globset`'s syntax); a pattern `globset` refuses (an unclosed `[`) is
/// taken literally. A leading `.` must be matched by a literal `.`.
fn glob_match(pattern: &str, name: &str) -> bool {
    if name.starts_with('.') && !pattern.starts_with('.') {
        return false;
    }
    match globset::GlobBuilder::new(pattern).literal_separator(true).backslash_escape(false).build() {
        Ok(glob) => glob.compile_matcher().is_match(name),
        Err(_) => pattern == name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(path: &Path, text: &str) -> Result<Vec<String>, ConfigError> {
        args_given(path, text, &[])
    }

    fn args_given(path: &Path, text: &str, given: &[&str]) -> Result<Vec<String>, ConfigError> {
        let given = |id: &str| given.contains(&id);
        Ok(file_arguments("run", path, text, &given)?.into_iter().map(|a| a.into_string().unwrap()).collect())
    }

    #[test]
    fn eval_has_run_s_keys_and_its_own() {
        let text = "models = 'models'\ndata = ['test/*.tfrecord', 'more.npz']\nlabel = 'y'\nmetric = ['accuracy', 'auc']\njobs = 2\nbaseline = 'last.json'\n";
        let given = |_: &str| false;
        let got: Vec<String> = file_arguments("eval", Path::new("/cfg/eval.toml"), text, &given)
            .unwrap()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            got,
            [
                "/cfg/models",
                "--data=/cfg/test/*.tfrecord",
                "--data=/cfg/more.npz",
                "--label=y",
                "--metric=accuracy",
                "--metric=auc",
                "--jobs=2",
                "--baseline=/cfg/last.json"
            ]
        );
        // run has no such keys.
        let error = file_arguments("run", Path::new("/cfg/run.toml"), "label = 'y'\n", &given).unwrap_err();
        assert!(error.to_string().contains("unknown key 'label'"), "{error}");
    }

    #[test]
    fn label_classes_are_a_list_in_the_file_and_one_list_for_eval() {
        let text = "data = 'pets.csv'\nlabel = 'y'\nlabel-classes = ['cat', 'dog']\n";
        let args = file_arguments("eval", Path::new("/cfg/eval.toml"), text, &|_: &str| false).unwrap();
        let strings: Vec<String> = args.iter().map(|a| a.clone().into_string().unwrap()).collect();
        assert_eq!(strings, ["--data=/cfg/pets.csv", "--label=y", "--label-classes=cat", "--label-classes=dog"]);
        for argv in [
            ["isorun", "eval", "m/"].map(Into::into).into_iter().chain(args).collect::<Vec<OsString>>(),
            // A MODEL after the flag stays a MODEL.
            ["isorun", "eval", "--data=pets.csv", "--label=y", "--label-classes", "cat,dog", "m/"]
                .map(Into::into)
                .to_vec(),
        ] {
            let cli = <crate::cli::Cli as clap::Parser>::try_parse_from(&argv).unwrap();
            let crate::cli::Command::Eval(eval) = cli.command else { panic!("eval") };
            assert_eq!(eval.eval.label_classes, Some(vec!["cat".to_string(), "dog".to_string()]), "{argv:?}");
        }
    }

    fn error(text: &str) -> String {
        args(Path::new("nightly.toml"), text).unwrap_err().to_string()
    }

    #[test]
    fn keys_come_from_clap() {
        let keys = known_keys("run");
        let key = |name: &str| keys.iter().find(|k| k.name == name).unwrap_or_else(|| panic!("no key {name}"));
        assert_eq!((key("models").shape, key("models").kind), (Shape::List, Kind::Path));
        assert_eq!((key("input").shape, key("input").kind), (Shape::List, Kind::NamedPath));
        assert_eq!((key("jobs").shape, key("jobs").kind), (Shape::Single, Kind::Unsigned));
        assert_eq!((key("timeout").shape, key("timeout").kind), (Shape::Single, Kind::Float));
        assert_eq!((key("values").shape, key("verbose").shape), (Shape::Switch, Shape::Count));
        assert_eq!(key("retry-on").shape, Shape::List);
        assert_eq!(key("format").choices, ["jsonl", "table"]);
        assert_eq!(key("json").conflicts, ["format"]);
        assert_eq!(key("format").conflicts, ["json"]);
        assert_eq!(key("tag").id, "tags");
        assert_eq!(key("libtensorflow-dir").kind, Kind::Path);
        for absent in ["help", "version", "config", "worker-arg"] {
            assert!(keys.iter().all(|k| k.name != absent), "{absent} is no key");
        }
    }

    #[test]
    fn every_kind_of_value_becomes_arguments() {
        let text = r#"
models = ["a", "/abs/b"]
signature = "classify"
jobs = 2
timeout = 1.5
load_timeout = 3
values = true
json = false
verbose = 2
tag = "serve"
retry-on = ["crashed", "timeout"]
input = ["x=x.npy", "y=@[1, 2]"]
inputs = ["-", "batch.npz"]
memory-limit = "2G"
format = "jsonl"
"#;
        assert_eq!(
            args(Path::new("conf/nightly.toml"), text).unwrap(),
            [
                "conf/a",
                "/abs/b",
                "--signature=classify",
                "--jobs=2",
                "--timeout=1.5",
                "--load-timeout=3",
                "--values",
                "--verbose",
                "--verbose",
                "--tag=serve",
                "--retry-on=crashed",
                "--retry-on=timeout",
                "--input=x=conf/x.npy",
                "--input=y=@[1, 2]",
                "--inputs=-",
                "--inputs=conf/batch.npz",
                "--memory-limit=2G",
                "--format=jsonl",
            ]
        );
        // Next to the current directory: paths as written, a MODEL never read as a flag.
        assert_eq!(args(Path::new("nightly.toml"), "models = ['-odd', 'b']").unwrap(), ["./-odd", "b"]);
    }

    #[test]
    fn the_command_line_drops_keys_and_their_conflicts() {
        let text = "models = ['m']\nsignature = 'a'\ninput = ['x=x.npy']\nformat = 'table'\njobs = 3\n";
        let path = Path::new("nightly.toml");
        assert_eq!(args_given(path, text, &["signature", "input", "json", "jobs"]).unwrap(), ["m"]);
        assert_eq!(args_given(path, text, &["models"]).unwrap().len(), 4);
        // Overridden keys are still checked.
        assert!(args_given(path, "jobs = 'x'", &["jobs"]).is_err());
    }

    #[test]
    fn errors_name_the_file_line_and_key() {
        assert_eq!(
            error("models = ['m']\n\n# comment\njobs = 1\ntimeout_secs = 5\n"),
            "nightly.toml:5: unknown key 'timeout_secs' (did you mean 'timeout'?)"
        );
        assert_eq!(error("moddels = 'm'"), "nightly.toml:1: unknown key 'moddels' (did you mean 'models'?)");
        assert_eq!(error("\nfrobnicate = 1"), "nightly.toml:2: unknown key 'frobnicate'");
        assert_eq!(
            error("jobs = \"two\""),
            "nightly.toml:1: jobs: expected a non-negative integer, found string \"two\""
        );
        assert_eq!(error("\nvalues = 3"), "nightly.toml:2: values: expected true or false, found integer 3");
        assert_eq!(error("jobs = [1]"), "nightly.toml:1: jobs: expected a non-negative integer, found an array");
        assert_eq!(error("signature = 1.5"), "nightly.toml:1: signature: expected a string, found float 1.5");
        assert_eq!(
            error("tag = ['a',\n  2]"),
            "nightly.toml:2: tag: expected a string, or an array of them, found integer 2"
        );
        assert_eq!(error("batch-size = 0"), "nightly.toml:1: batch-size = 0: 0 is not in 1..18446744073709551615");
        assert_eq!(
            error("memory-limit = 'lots'"),
            "nightly.toml:1: memory-limit = \"lots\": 'lots' is not a size (try 512M, 2G, 2GiB, 2GB)"
        );
        assert_eq!(error("format = 'xml'"), "nightly.toml:1: format = \"xml\": expected one of \"jsonl\", \"table\"");
        assert_eq!(error("jobs = 2.5"), "nightly.toml:1: jobs: expected a non-negative integer, found float 2.5");
        assert_eq!(error("jobs = -1"), "nightly.toml:1: jobs: expected a non-negative integer, found integer -1");
        assert_eq!(error("config = 'x.toml'"), "nightly.toml:1: 'config' cannot be set in a config file");
        assert_eq!(
            error("jobs = 1\n[run]\njobs = 2"),
            "nightly.toml:2: table 'run' is not supported: settings are top-level keys"
        );
        assert_eq!(error("a.b = 1"), "nightly.toml:1: table 'a' is not supported: settings are top-level keys");
        assert_eq!(
            error("models-per-worker = 1\nmodels_per_worker = 2"),
            "nightly.toml:2: 'models_per_worker' is the same key as 'models-per-worker' on line 1"
        );
        assert_eq!(
            error("json = true\nformat = 'table'"),
            "nightly.toml:2: 'format' cannot be used with 'json' (line 1)"
        );
        assert_eq!(error("jobs = 1\nsignature = \"x"), "nightly.toml:2:15: invalid TOML: invalid basic string");
    }

    #[test]
    fn suggestions_are_close_or_prefixes() {
        let known = ["timeout", "load-timeout", "models", "inputs", "input", "jobs"];
        assert_eq!(suggest("timeout_secs", known.into_iter()), Some("timeout"));
        assert_eq!(suggest("input_s", known.into_iter()), Some("inputs"));
        assert_eq!(suggest("job", known.into_iter()), Some("jobs"));
        assert_eq!(suggest("colour", known.into_iter()), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn glob_patterns() {
        assert!(glob_match("*", "abc"));
        assert!(glob_match("a*c", "abbbc"));
        assert!(glob_match("a*b*c", "axxbyyc"));
        assert!(!glob_match("a*c", "abcd"));
        assert!(glob_match("?b?", "abc"));
        assert!(glob_match("[a-c]x", "bx"));
        assert!(!glob_match("[!a-c]x", "bx"));
        assert!(glob_match("[^a]x", "zx"));
        assert!(glob_match("[]]", "]"));
        assert!(glob_match("a[", "a["));
        assert!(!glob_match("*", ".hidden"));
        assert!(glob_match(".*", ".hidden"));
        assert!(glob_match("v*", "v1"));
        assert!(!glob_match("", "x"));
    }

    #[test]
    fn globs_expand_sorted_relative_to_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        for dir in ["models/b/saved", "models/a/saved", "models/c/other", "models/.hidden/saved", "deep/x/y/saved"] {
            std::fs::create_dir_all(tmp.path().join(dir)).unwrap();
        }
        let config = tmp.path().join("nightly.toml");
        let found = args(&config, "models = ['models/*/saved', 'deep/**/saved']").unwrap();
        let root = tmp.path().display();
        assert_eq!(
            found,
            [format!("{root}/models/a/saved"), format!("{root}/models/b/saved"), format!("{root}/deep/x/y/saved")]
        );
        let err = args(&config, "\nmodels = ['models/*/nope']").unwrap_err().to_string();
        assert_eq!(err, format!("{}:2: models: 'models/*/nope' matches nothing", config.display()));
    }
}
