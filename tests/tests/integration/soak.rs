//! Soak: many units, a seeded random mix of good models and every kind of
//! failure (crash, hang, memory hog, garbage, slow start), four workers at
//! once, and workers killed with SIGKILL from outside at random. Whatever
//! happens, every unit has exactly one final record, no process is left,
//! the supervisor's memory stays flat, and a journal resumes correctly after
//! the supervisor itself is killed.
//!
//! The short version (100 units) runs with the other tests; the long one
//! (1,000 units) is `#[ignore]`d and run by `scripts/soak`.

use crate::hostile::{assert_none_left, status_bytes, unique_marker};
use crate::util::{fake_models, isorun_fault, processes_mentioning, write_input};
use serde_json::Value;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// xorshift64*: a few lines, seeded, the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a unit was made to do, and the statuses that may end it (besides
/// `crashed`, which any unit may get from the outside killer).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Good,
    Crash,
    Hang,
    Hog,
    Garbage,
    SlowStart,
}

impl Kind {
    fn folder_suffix(self) -> &'static str {
        match self {
            Kind::Good => "good",
            Kind::Crash => "fault-segfault",
            Kind::Hang => "fault-hang",
            Kind::Hog => "fault-hog-1024",
            Kind::Garbage => "fault-garbage",
            Kind::SlowStart => "fault-slow-start-150",
        }
    }

    fn expected(self) -> &'static str {
        match self {
            Kind::Good | Kind::SlowStart => "ok",
            Kind::Crash => "crashed",
            Kind::Hang => "timeout",
            Kind::Hog => "memory_limit",
            Kind::Garbage => "protocol_error",
        }
    }

    /// Two thirds good, the rest spread over the faults.
    fn pick(rng: &mut Rng) -> Kind {
        match rng.below(30) {
            0..=19 => Kind::Good,
            20..=21 => Kind::Crash,
            22..=23 => Kind::Hang,
            24 => Kind::Hog,
            25..=26 => Kind::Garbage,
            _ => Kind::SlowStart,
        }
    }
}

/// Every `every`, on a coin toss, kills a random process carrying `marker`
/// other than the supervisor (a worker), until stopped; counts the kills.
fn start_killer(
    marker: String,
    supervisor: u32,
    every: Duration,
    seed: u64,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<usize>) {
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&stop);
    let handle = std::thread::spawn(move || {
        let mut rng = Rng::new(seed);
        let mut kills = 0;
        while !stopping.load(Ordering::SeqCst) {
            std::thread::sleep(every);
            let workers: Vec<i32> = processes_mentioning(&marker)
                .iter()
                .filter_map(|p| p.split_once(':').and_then(|(pid, _)| pid.parse::<u32>().ok()))
                .filter(|&pid| pid != supervisor)
                .map(|pid| pid as i32)
                .collect();
            if workers.is_empty() || rng.below(2) == 0 {
                continue;
            }
            let pid = workers[rng.below(workers.len() as u64) as usize];
            // SAFETY: a signal to a process of this test's own run.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                kills += 1;
            }
        }
        kills
    });
    (stop, handle)
}

/// One soak: `units` models, `-j 4`, the killer at work; then a journal
/// killed with its supervisor and resumed.
fn soak(units: usize, seed: u64) {
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let mut rng = Rng::new(seed);
    let kinds: Vec<Kind> = (0..units).map(|_| Kind::pick(&mut rng)).collect();
    let names: Vec<String> = kinds.iter().enumerate().map(|(i, k)| format!("{i:04}-{}", k.folder_suffix())).collect();
    let names_ref: Vec<&str> = names.iter().map(String::as_str).collect();
    fake_models(&root.join("models"), &names_ref);
    let input = write_input(root);
    let marker = unique_marker("soak");

    let mut command = isorun_fault(&[&marker]);
    command.arg(root.join("models")).arg(format!("--input=x={}", input.display())).args([
        "-j",
        "4",
        "--timeout",
        "1.5",
        "--memory-limit",
        "64M",
        "--json",
    ]);
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id();
    let stderr = drain(child.stderr.take().unwrap());
    let (stop_killer, killer) = start_killer(marker.clone(), pid, Duration::from_millis(300), seed ^ 0x5eed);
    let mut records = Vec::new();
    let (mut rss_early, mut rss_late) = (None, None);
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        records.push(serde_json::from_str::<Value>(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")));
        if records.len() == units / 10 {
            rss_early = status_bytes(pid, "VmRSS");
        }
        if records.len() == units * 9 / 10 {
            rss_late = status_bytes(pid, "VmRSS");
        }
    }
    let status = child.wait().unwrap();
    stop_killer.store(true, Ordering::SeqCst);
    let kills = killer.join().unwrap();
    let stderr = stderr.join().unwrap();
    let mixed_secs = started.elapsed().as_secs_f64();
    assert_eq!(status.code(), Some(1), "some units fail on purpose\n{stderr}");

    // Exactly one final record per unit, in model order.
    let ids: Vec<&str> = records.iter().map(|r| r["model"].as_str().unwrap()).collect();
    assert_eq!(ids, names_ref, "one record per model, each once, in order");
    let mut tally: HashMap<String, usize> = HashMap::new();
    let mut killed = 0;
    for (record, kind) in records.iter().zip(&kinds) {
        let status = record["status"].as_str().unwrap();
        *tally.entry(status.to_string()).or_default() += 1;
        let killed_from_outside = status == "crashed" && record["signal"] == 9;
        killed += usize::from(killed_from_outside && *kind != Kind::Crash);
        assert!(status == kind.expected() || killed_from_outside, "{kind:?} ended {status}: {record}");
    }
    assert_none_left(&marker);
    let (early, late) = (rss_early.expect("RSS after 10%"), rss_late.expect("RSS after 90%"));
    assert!(late <= early + (16 << 20), "the supervisor grew from {} to {} KiB", early >> 10, late >> 10);
    let mut made: HashMap<String, usize> = HashMap::new();
    for kind in &kinds {
        *made.entry(format!("{kind:?}")).or_default() += 1;
    }
    eprintln!(
        "soak of {units} units (seed {seed}): {mixed_secs:.1} s, made {made:?}, statuses {tally:?}, {kills} \
         workers killed from outside ({killed} units ended by it), supervisor RSS {} KiB after 10%, {} KiB after 90%",
        early >> 10,
        late >> 10
    );

    journal_survives_a_killed_supervisor(root, (units / 5).max(20), &input);
    eprintln!("soak of {units} units: {:.1} s in all", started.elapsed().as_secs_f64());
}

/// Reads a pipe to its end on a thread of its own.
fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

/// SIGKILL to the supervisor after 40% of the records, then `--resume`:
/// every model exactly once, the journaled ones marked resumed and not
/// computed again, and no worker left by the killed supervisor.
fn journal_survives_a_killed_supervisor(root: &Path, models: usize, input: &Path) {
    let names: Vec<String> = (0..models)
        .map(|i| if i % 4 == 3 { format!("{i:03}-fault-slow-300") } else { format!("{i:03}-good") })
        .collect();
    let names_ref: Vec<&str> = names.iter().map(String::as_str).collect();
    let dir = root.join("journal-models");
    fake_models(&dir, &names_ref);
    let journal = root.join("journal.jsonl");
    let log = root.join("computed.log");
    let marker = unique_marker("soak-journal");
    let command = |resume: bool| {
        let mut command = isorun_fault(&[&marker, &format!("--log={}", log.display())]);
        command.arg(&dir).arg(format!("--input=x={}", input.display())).args(["-j", "4", "--json", "--journal"]);
        command.arg(&journal);
        if resume {
            command.arg("--resume");
        }
        command
    };
    let mut first: Command = command(false);
    let mut child = first.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for _ in 0..models * 4 / 10 {
        lines.next().expect("a record").unwrap();
    }
    // SAFETY: killing our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    // Its workers die with it (PR_SET_PDEATHSIG).
    assert_none_left(&marker);
    let journaled: Vec<String> = std::fs::read_to_string(&journal)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|r| r["model"].as_str().unwrap().to_string())
        .collect();
    assert!(journaled.len() >= models * 4 / 10, "{} journaled, {} printed", journaled.len(), models * 4 / 10);
    assert!(journaled.len() < models, "the supervisor was killed before the end");

    let mut second = command(true);
    let output = second.stderr(Stdio::piped()).output().unwrap();
    let ran = crate::util::ran(output);
    assert_eq!(ran.code, Some(0), "{}", ran.stderr);
    let ids: Vec<&str> = ran.records.iter().map(|r| r["model"].as_str().unwrap()).collect();
    assert_eq!(ids, names_ref, "every model exactly once, in order");
    let computed = std::fs::read_to_string(&log).unwrap();
    for record in &ran.records {
        let id = record["model"].as_str().unwrap();
        let was_journaled = journaled.iter().any(|j| j == id);
        assert_eq!(record["resumed"] == true, was_journaled, "{record}");
        if was_journaled {
            // Counted as substrings: workers appending at once may interleave
            // a name and another's newline (the fault worker writes them apart).
            assert_eq!(computed.matches(id).count(), 1, "{id} was computed once");
        }
    }
    assert_none_left(&marker);
}

#[test]
fn soak_short_100_units() {
    soak(100, 0x15_0a11);
}

#[test]
#[ignore = "about ten times the short soak; run by scripts/soak"]
fn soak_long_1000_units() {
    soak(1000, 0x1000_0a11);
}
