//! `isorun-worker --in-process [--batch N] [--signature KEY] [--repeat N] [--onnxruntime PATH]
//! MODEL...`: loads and runs every model one after another in this one
//! process, with zero inputs shaped from each signature (unknown dimensions
//! become N, default 1), and prints one line per model and the total. It is
//! the floor that `scripts/bench` measures isolation against: the same C API
//! calls, no process per model, and none of isorun's guarantees. With
//! `--repeat N` each model's signature then runs N more times on the same
//! inputs, and a `repeat` line gives those N runs' total and the first one's
//! time: the floor for `isorun pipe`'s requests per second (the same calls,
//! no IPC). With `--pipe`, the first model instead answers JSON Lines on
//! stdin exactly as `isorun pipe` does (the same parsing and answer code,
//! `isorun_tensors::pipe`), one flushed line per request: the fair floor for
//! `pipe`, all of its work but the process boundary. `--caller-thread` runs
//! ops on the calling thread (`inter_op_parallelism_threads` = -1). With
//! `--pipe --across-processes` the model runs in a child process instead,
//! forked before anything is loaded: this process parses each line, hands
//! the tensors over a UNIX socket (one frame each way, both sides polling
//! for up to 50 µs before they sleep, as `pipe`'s defaults do) and writes
//! the answer. That is the floor plus the bare process boundary, with none
//! of isorun's supervisor, protocol or sandbox: what `pipe` is bounded by.
//!
//! A MODEL that ends in `.onnx` is loaded and run through ONNX Runtime's C
//! API exactly as a worker does (`onnx.rs`: one session created and
//! released per model, zero inputs shaped from the graph, unknown
//! dimensions = `--batch N`), with the library named by `--onnxruntime
//! PATH` (a flag and not `locate.rs`'s search, so that the floor opens the
//! very file the bench gave isorun: the worker is told its library by the
//! supervisor too, and has no search of its own). A first line gives the
//! time to open the library alone (its `dlopen`, what a zygote could do
//! before it forks). It is the floor for the bench's ONNX rows; `--pipe`
//! takes SavedModels only.

use crate::onnx::OnnxModel;
use crate::tf::SavedModel;
use crate::warm::{with_dense_bytes, zero_inputs};
use isorun_protocol::matching::match_inputs;
use isorun_protocol::{ModelError, SessionConfig, Tensor};
use isorun_transport::{dense_bytes, read_frame, write_frame, DEFAULT_MAX_FRAME};
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

pub fn main(args: &[String]) -> i32 {
    let mut batch = 1u64;
    let mut signature = "serving_default".to_string();
    let mut repeat = 0u64;
    let mut models = Vec::new();
    let mut pipe = false;
    let mut caller_thread = false;
    let mut across_processes = false;
    let mut onnxruntime: Option<String> = None;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--batch" => batch = rest.next().and_then(|n| n.parse().ok()).unwrap_or(1),
            "--signature" => signature = rest.next().cloned().unwrap_or_default(),
            "--repeat" => repeat = rest.next().and_then(|n| n.parse().ok()).unwrap_or(0),
            "--pipe" => pipe = true,
            "--caller-thread" => caller_thread = true,
            "--across-processes" => across_processes = true,
            "--onnxruntime" => onnxruntime = rest.next().cloned(),
            model => models.push(model.to_string()),
        }
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let config = SessionConfig {
        intra_op_threads: cpus,
        inter_op_threads: cpus,
        ops_on_caller_thread: caller_thread,
        // As `isorun pipe`'s default `--spin-us 50`, so that an ONNX
        // session here spins between requests as a piped worker's does (the
        // floor itself has no socket to poll).
        spin_us: if pipe { 50 } else { 0 },
        gpu_allow_growth: true,
        gpu_memory_fraction: None,
        skip_grappler: false,
    };
    if pipe {
        let Some(model_dir) = models.first() else {
            eprintln!("--pipe needs a model");
            return 2;
        };
        if across_processes {
            return serve_pipe_across_processes(Path::new(model_dir), &signature, &config);
        }
        return serve_pipe(Path::new(model_dir), &signature, &config);
    }
    let started = Instant::now();
    if let Some(library) = onnxruntime.as_deref().filter(|_| models.iter().any(|m| is_onnx(m))) {
        // The library alone (what a zygote could do before it forks), then
        // the first model pays the environment.
        let opening = Instant::now();
        if let Err(e) = crate::onnx::open_library(library) {
            eprintln!("{e}");
            return 1;
        }
        println!("{library}\topen {:.1} ms", opening.elapsed().as_secs_f64() * 1e3);
    }
    for model_dir in &models {
        if is_onnx(model_dir) {
            let Some(library) = &onnxruntime else {
                eprintln!(
                    "{model_dir}: an .onnx model needs --onnxruntime PATH (ONNX Runtime's libonnxruntime.so.1.*)"
                );
                return 2;
            };
            if let Err(e) = run_onnx(library, model_dir, batch, repeat, &config) {
                eprintln!("{model_dir}: {e}");
                return 1;
            }
            continue;
        }
        let unit = Instant::now();
        let model = match SavedModel::load(Path::new(model_dir), &["serve".to_string()], &config) {
            Ok(model) => model,
            Err(e) => {
                eprintln!("{model_dir}: {e}");
                return 1;
            }
        };
        let loaded = unit.elapsed();
        let tensors = match model.signature(&signature) {
            Ok((info, _)) => zero_inputs(&info, batch),
            Err(e) => {
                eprintln!("{model_dir}: {e}");
                return 1;
            }
        };
        let inputs = with_dense_bytes(&tensors);
        if let Err(e) = model.run(&signature, &inputs) {
            eprintln!("{model_dir}: {e}");
            return 1;
        }
        println!(
            "{model_dir}\tload {:.1} ms\ttotal {:.1} ms",
            loaded.as_secs_f64() * 1e3,
            unit.elapsed().as_secs_f64() * 1e3
        );
        if repeat > 0 {
            let runs = Instant::now();
            let mut first = None;
            for _ in 0..repeat {
                let one = Instant::now();
                if let Err(e) = model.run(&signature, &inputs) {
                    eprintln!("{model_dir}: {e}");
                    return 1;
                }
                first.get_or_insert(one.elapsed());
            }
            println!(
                "{model_dir}\trepeat {repeat} runs\t{:.3} s\tfirst {:.3} ms",
                runs.elapsed().as_secs_f64(),
                first.unwrap_or_default().as_secs_f64() * 1e3
            );
        }
    }
    println!("total\t{:.3} s\t{} models", started.elapsed().as_secs_f64(), models.len());
    0
}

/// Whether `model` names an ONNX file (by its extension, as discovery does).
fn is_onnx(model: &str) -> bool {
    Path::new(model).extension().is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// Loads the `.onnx` file at `path` with ONNX Runtime's library at
/// `library`, runs it once on zero inputs (`repeat` more times after) and
/// releases its session, printing the lines `main` prints for a SavedModel.
fn run_onnx(library: &str, path: &str, batch: u64, repeat: u64, config: &SessionConfig) -> Result<(), ModelError> {
    let unit = Instant::now();
    let mut model = OnnxModel::load(library, path, config)?;
    let loaded = unit.elapsed();
    let inputs: Vec<(String, Tensor)> = {
        let signature = model.signature()?;
        let tensors = zero_inputs(signature, batch);
        signature.inputs.iter().map(|spec| spec.name.clone()).zip(tensors).collect()
    };
    let mut run_time = std::time::Duration::ZERO;
    model.run(&inputs, &[], &mut run_time)?;
    println!("{path}\tload {:.1} ms\ttotal {:.1} ms", loaded.as_secs_f64() * 1e3, unit.elapsed().as_secs_f64() * 1e3);
    if repeat > 0 {
        let runs = Instant::now();
        let mut first = None;
        for _ in 0..repeat {
            let one = Instant::now();
            model.run(&inputs, &[], &mut run_time)?;
            first.get_or_insert(one.elapsed());
        }
        println!(
            "{path}\trepeat {repeat} runs\t{:.3} s\tfirst {:.3} ms",
            runs.elapsed().as_secs_f64(),
            first.unwrap_or_default().as_secs_f64() * 1e3
        );
    }
    // The session is released here, before the next model's is created.
    drop(model);
    Ok(())
}

/// Answers JSON Lines on stdin as `isorun pipe` does, in this process.
fn serve_pipe(model_dir: &Path, key: &str, config: &SessionConfig) -> i32 {
    let model = match SavedModel::load(model_dir, &["serve".to_string()], config) {
        Ok(model) => model,
        Err(e) => {
            eprintln!("{}: {e}", model_dir.display());
            return 1;
        }
    };
    answer_stdin(model_dir, key, &mut |ordered| {
        let inputs: Vec<_> = ordered.into_iter().map(|t| (t, dense_bytes(t, &[]))).collect();
        Some(model.run(key, &inputs))
    })
}

/// What a request's run gives: its outputs, or the model's error.
type Answer = Result<Vec<(String, Tensor)>, ModelError>;

/// Reads JSON Lines on stdin and writes one flushed answer line per
/// non-blank line, with `isorun pipe`'s own parsing and answer code; `run`
/// runs one request's inputs (in the signature's order), `None` when it
/// cannot go on. 0 at the end of input (or once nobody reads stdout), else 1.
fn answer_stdin(model_dir: &Path, key: &str, run: &mut dyn FnMut(Vec<&Tensor>) -> Option<Answer>) -> i32 {
    let signature = match isorun_tensors::json_input::signature_of(model_dir, &["serve".to_string()], key) {
        Ok(signature) => signature,
        Err(e) => {
            eprintln!("{}: {e}", model_dir.display());
            return 1;
        }
    };
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    for line in stdin.split(b'\n') {
        let Ok(line) = line else { return 1 };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let answer = match isorun_tensors::pipe::parse_request(&signature, &line) {
            Err(error_line) => error_line,
            Ok((id, tensors)) => {
                let answer = match match_inputs(&signature, &tensors) {
                    Ok(ordered) => match run(ordered) {
                        Some(answer) => answer,
                        None => return 1,
                    },
                    Err(e) => Err(e),
                };
                match answer {
                    Ok(outputs) => isorun_tensors::pipe::answer_line(id, &outputs),
                    Err(e) => isorun_tensors::pipe::error_line(id, e.kind.name(), e.code.as_deref(), &e.message),
                }
            }
        };
        if writeln!(stdout, "{answer}").and_then(|_| stdout.flush()).is_err() {
            return 0;
        }
    }
    0
}

/// How long each side of `--across-processes` polls for the other's frame
/// before it sleeps: `isorun pipe`'s default `--spin-us`.
const ACROSS_SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// `serve_pipe` with the model in a child process: the same lines, the same
/// answers, one round trip over a socket per request.
fn serve_pipe_across_processes(model_dir: &Path, key: &str, config: &SessionConfig) -> i32 {
    let (mut socket, theirs) = match std::os::unix::net::UnixStream::pair() {
        Ok(pair) => pair,
        Err(e) => {
            eprintln!("socketpair: {e}");
            return 1;
        }
    };
    // Forked before TensorFlow starts a thread (nothing is loaded yet).
    // SAFETY: this process has one thread here; the child only runs Rust code of its own.
    let child = unsafe { libc::fork() };
    if child < 0 {
        eprintln!("fork: {}", std::io::Error::last_os_error());
        return 1;
    }
    if child == 0 {
        drop(socket);
        // SAFETY: ends the child without running the parent's exit handlers twice.
        unsafe { libc::_exit(run_for_parent(model_dir, key, config, theirs)) };
    }
    drop(theirs);
    let code = answer_stdin(model_dir, key, &mut |ordered| {
        write_frame(&mut socket, &ordered).ok()?;
        wait_spinning(&socket, ACROSS_SPIN);
        read_frame::<Answer>(&mut socket, DEFAULT_MAX_FRAME).ok()
    });
    drop(socket);
    let mut status = 0;
    // SAFETY: our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    code
}

/// The child of `--across-processes`: loads the model, then runs each
/// request that comes and sends back its outputs or its error.
fn run_for_parent(
    model_dir: &Path,
    key: &str,
    config: &SessionConfig,
    mut socket: std::os::unix::net::UnixStream,
) -> i32 {
    let model = match SavedModel::load(model_dir, &["serve".to_string()], config) {
        Ok(model) => model,
        Err(e) => {
            eprintln!("{}: {e}", model_dir.display());
            return 1;
        }
    };
    loop {
        wait_spinning(&socket, ACROSS_SPIN);
        let Ok(inputs) = read_frame::<Vec<Tensor>>(&mut socket, DEFAULT_MAX_FRAME) else { return 0 };
        let inputs: Vec<_> = inputs.iter().map(|t| (t, dense_bytes(t, &[]))).collect();
        let answer: Answer = model.run(key, &inputs);
        if write_frame(&mut socket, &answer).is_err() {
            return 1;
        }
    }
}

/// Polls `socket` for up to `budget` until the other side's first byte is there
/// (then the blocking read that follows finds it without sleeping).
fn wait_spinning(socket: &std::os::unix::net::UnixStream, budget: std::time::Duration) {
    if budget.is_zero() {
        return;
    }
    let until = Instant::now() + budget;
    let mut byte = [0u8; 1];
    while Instant::now() < until {
        // SAFETY: one byte of a valid buffer; MSG_PEEK leaves it in the socket.
        let got = unsafe {
            libc::recv(
                std::os::fd::AsRawFd::as_raw_fd(socket),
                byte.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        // A byte, the end of the stream or an error: the read that follows says which.
        if got >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock {
            return;
        }
        // Yield, so that a supervisor woken on this CPU runs at once.
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    }
}
