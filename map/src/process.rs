//! One Python interpreter running `zygote.py`, seen from the supervisor:
//! started (through the sandbox launcher unless `--sandbox off`) in a
//! session of its own with the thread-pool variables set to 1, its hello
//! read, then asked per call to fork (or, in `direct` mode, to be the call
//! itself: the fallback when forking it would not be safe). Messages are
//! JSON over a `SOCK_SEQPACKET` pair; the socket end a call uses, and the
//! child's pidfd, travel as `SCM_RIGHTS`.

use crate::fd;
use crate::{MapSettings, THREAD_VARS, ZYGOTE_SCRIPT};
use serde_json::{json, Value};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long the zygote may take to answer a fork or report an exit.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The descriptor number the zygote finds its control socket at.
const CONTROL_FD: i32 = 3;

/// What the zygote says once its imports are done.
#[derive(Debug, Clone)]
pub struct Hello {
    pub pid: u32,
    pub python: String,
    pub executable: String,
    pub source_sha256: Option<String>,
    pub qualname: String,
    /// Threads at hello (1 when forking is safe).
    pub threads: u64,
    /// A CUDA library mapped at hello.
    pub cuda: Option<String>,
    /// Sandbox protections the kernel did not give (comma-separated).
    pub sandbox_missing: Option<String>,
}

/// Why a zygote could not start, or stopped answering.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The function cannot be loaded: bad input (kind: no_module,
    /// import_failed, no_function, bad_function_pickle, no_preload).
    #[error("{message}")]
    Load { kind: String, message: String, traceback: String },
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    /// It ended while it imported: `status` in words (`killed by SIGSEGV`),
    /// `signal` the signal's name when one ended it.
    #[error("the interpreter ended before it said hello ({status}; anything it printed is above)")]
    DiedAtStart { status: String, signal: Option<String> },
    #[error("the interpreter said nothing for {0} s")]
    Silent(u64),
    #[error("the zygote ended")]
    Gone,
    /// It is stopped (SIGSTOP, a debugger): it cannot answer.
    #[error("the zygote was stopped")]
    Frozen,
    #[error("stopped while the interpreter started")]
    Stopped,
    #[error("the zygote broke the protocol: {0}")]
    Protocol(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A started interpreter.
pub struct Zygote {
    pid: u32,
    pidfd: OwnedFd,
    control: OwnedFd,
    pub hello: Hello,
    /// Each call is this process itself (started for one call).
    pub direct: bool,
    reaped: bool,
    /// Exits the zygote reported that nobody asked for yet, by pid.
    exits: std::collections::HashMap<u32, (i32, u64)>,
}

/// A child forked for one call.
pub struct Forked {
    pub pid: u32,
    /// `None` in direct mode: the zygote's own pidfd then.
    pidfd: Option<OwnedFd>,
}

/// Why a fork was not made.
#[derive(Debug)]
pub enum ForkRefused {
    /// The zygote is not safe to fork any more (threads, CUDA): say why,
    /// and use a fresh interpreter per call from now on.
    Unsafe(String),
    Failed(ProcessError),
}

impl Zygote {
    /// Starts the interpreter and waits for its hello (or for `stop`).
    pub fn start(
        settings: &MapSettings,
        temp: &Path,
        direct: bool,
        stop: &(dyn Fn() -> bool + Sync),
    ) -> Result<Zygote, ProcessError> {
        let (control, theirs) = fd::socket_pair(libc::SOCK_SEQPACKET)?;
        let original: serde_json::Map<String, Value> = THREAD_VARS
            .iter()
            .map(|(name, _)| (name.to_string(), std::env::var(name).map_or(Value::Null, Value::String)))
            .collect();
        let spec = json!({
            "module": settings.module,
            "function": settings.function,
            "function_pickle": settings.function_pickle,
            "preload": settings.preload,
            "values_dir": settings.values_dir,
            "value_cap": settings.value_cap,
            "value_cap_text": isorun_protocol::human_bytes(settings.value_cap),
            "original_env": original,
            "direct": direct,
        });
        let mut env: Vec<(String, String)> = std::env::vars()
            .filter(|(name, _)| !THREAD_VARS.iter().any(|(var, _)| var == name) && !name.starts_with("ISORUN_MAP_"))
            .collect();
        env.extend(THREAD_VARS.iter().map(|(name, value)| (name.to_string(), value.to_string())));
        env.push(("TMPDIR".into(), temp.to_string_lossy().into_owned()));
        env.push(("ISORUN_MAP_FD".into(), CONTROL_FD.to_string()));
        env.push(("ISORUN_MAP_SPEC".into(), spec.to_string()));
        let python = settings.python.to_string_lossy().into_owned();
        let args = vec!["-c".to_string(), ZYGOTE_SCRIPT.to_string()];
        let (mut command, program) = match &settings.sandbox {
            Some(sandbox) => {
                let mut writable = sandbox.writable.clone();
                writable.push(temp.to_path_buf());
                writable.extend(settings.values_dir.clone());
                let spec = crate::launch::LaunchSpec {
                    writable: writable.iter().map(|p| p.to_string_lossy().into_owned()).collect(),
                    network: sandbox.network,
                    env,
                    program: python.clone(),
                    args,
                };
                let mut command = Command::new(&sandbox.launcher);
                command.arg(crate::launch::LAUNCH_ARG).arg(serde_json::to_string(&spec).expect("plain data"));
                command.env_clear();
                (command, sandbox.launcher.to_string_lossy().into_owned())
            }
            None => {
                let mut command = Command::new(&python);
                command.args(&args).env_clear().envs(env);
                (command, python.clone())
            }
        };
        // Its stdout is our stderr: our stdout holds the records.
        let stdout = std::io::stderr().as_raw_fd();
        // SAFETY: dup of our own stderr.
        let stdout = unsafe { libc::dup(stdout) };
        if stdout >= 0 {
            // SAFETY: a new descriptor, ours.
            command.stdout(unsafe { <Stdio as std::os::fd::FromRawFd>::from_raw_fd(stdout) });
        }
        command.stdin(Stdio::null());
        let child_end = theirs.as_raw_fd();
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            command.pre_exec(move || {
                libc::setsid();
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                if child_end == CONTROL_FD {
                    libc::fcntl(CONTROL_FD, libc::F_SETFD, 0);
                } else if libc::dup2(child_end, CONTROL_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|source| ProcessError::Spawn { program, source })?;
        drop(theirs);
        let pid = child.id();
        // Reaped with wait4 by pid (std's Child does not reap on drop).
        drop(child);
        let pidfd = fd::pidfd_open(pid)?;
        let mut zygote = Zygote {
            pid,
            pidfd,
            control,
            hello: Hello {
                pid,
                python: String::new(),
                executable: String::new(),
                source_sha256: None,
                qualname: String::new(),
                threads: 0,
                cuda: None,
                sandbox_missing: None,
            },
            direct,
            reaped: false,
            exits: std::collections::HashMap::new(),
        };
        // Imports can take long (TensorFlow: seconds): a stop ends the wait.
        let deadline = std::time::Instant::now() + settings.start_timeout;
        while !fd::readable(&zygote.control, Duration::from_millis(100))? {
            if stop() {
                return Err(ProcessError::Stopped);
            }
            if std::time::Instant::now() >= deadline {
                return Err(ProcessError::Silent(settings.start_timeout.as_secs()));
            }
        }
        let message = match zygote.receive(Duration::ZERO) {
            Ok((message, _)) => message,
            Err(ProcessError::Gone) => {
                return Err(match zygote.reap() {
                    Ok(status) => ProcessError::DiedAtStart {
                        status: describe_status(status),
                        signal: libc::WIFSIGNALED(status.0)
                            .then(|| isorun_protocol::signal_name(libc::WTERMSIG(status.0))),
                    },
                    Err(e) => ProcessError::DiedAtStart { status: e.to_string(), signal: None },
                });
            }
            Err(ProcessError::Silent(_)) => return Err(ProcessError::Silent(settings.start_timeout.as_secs())),
            Err(e) => return Err(e),
        };
        let hello = &message["hello"];
        if let Some(error) = hello.get("error") {
            return Err(ProcessError::Load {
                kind: error["kind"].as_str().unwrap_or("").to_string(),
                message: error["message"].as_str().unwrap_or("").to_string(),
                traceback: error["traceback"].as_str().unwrap_or("").to_string(),
            });
        }
        if !hello.is_object() {
            return Err(ProcessError::Protocol(format!("expected a hello, got {message}")));
        }
        zygote.hello = Hello {
            pid,
            python: hello["python"].as_str().unwrap_or("").to_string(),
            executable: hello["executable"].as_str().unwrap_or("").to_string(),
            source_sha256: hello["source_sha256"].as_str().map(str::to_string),
            qualname: hello["qualname"].as_str().unwrap_or("").to_string(),
            threads: hello["threads"].as_u64().unwrap_or(0),
            cuda: hello["cuda"].as_str().map(str::to_string),
            sandbox_missing: hello["sandbox_missing"].as_str().map(str::to_string),
        };
        Ok(zygote)
    }

    /// One message from the zygote, within `timeout`.
    fn receive(&self, timeout: Duration) -> Result<(Value, Vec<OwnedFd>), ProcessError> {
        if !fd::readable(&self.control, timeout)? {
            return Err(ProcessError::Silent(timeout.as_secs()));
        }
        let (data, fds) = fd::recv_with_fds(&self.control, 1 << 16)?;
        if data.is_empty() {
            return Err(ProcessError::Gone);
        }
        let message = serde_json::from_slice(&data)
            .map_err(|e| ProcessError::Protocol(format!("not JSON ({e}): {}", String::from_utf8_lossy(&data))))?;
        Ok((message, fds))
    }

    /// Asks for a process for one call, handing it `socket` (its end of
    /// the call's socket pair); `env` is set in it before the function runs.
    pub fn fork(&mut self, socket: OwnedFd, env: &Value) -> Result<Forked, ForkRefused> {
        let request = json!({"env": env}).to_string();
        fd::send_with_fds(&self.control, request.as_bytes(), &[socket.as_raw_fd()])
            .map_err(|e| ForkRefused::Failed(e.into()))?;
        drop(socket);
        if self.direct {
            return Ok(Forked { pid: self.pid, pidfd: None });
        }
        let (message, mut fds) = loop {
            let (message, fds) = self.receive_unless_stopped(ANSWER_TIMEOUT).map_err(ForkRefused::Failed)?;
            // Another child (a spare's sibling) may end meanwhile.
            if !self.stash_exit(&message) {
                break (message, fds);
            }
        };
        if let Some(why) = message["fallback"].as_str() {
            return Err(ForkRefused::Unsafe(why.to_string()));
        }
        match (message["forked"].as_u64(), fds.pop()) {
            (Some(pid), Some(pidfd)) => Ok(Forked { pid: pid as u32, pidfd: Some(pidfd) }),
            _ => Err(ForkRefused::Failed(ProcessError::Protocol(format!("expected a fork, got {message}")))),
        }
    }

    /// The pidfd to watch and kill the call through (the zygote's own, in
    /// direct mode).
    pub fn pidfd_of(&self, forked: &Forked) -> std::io::Result<OwnedFd> {
        forked.pidfd.as_ref().unwrap_or(&self.pidfd).try_clone()
    }

    /// The call's wait status and peak resident memory (bytes), once it
    /// has ended: the zygote reaps it and says; a direct process is ours.
    pub fn exited(&mut self, forked: &Forked) -> Result<(i32, u64), ProcessError> {
        if self.direct {
            return Ok(self.reap()?);
        }
        loop {
            if let Some(exit) = self.exits.remove(&forked.pid) {
                return Ok(exit);
            }
            let (message, _) = self.receive_unless_stopped(ANSWER_TIMEOUT)?;
            if !self.stash_exit(&message) {
                return Err(ProcessError::Protocol(format!("expected an exit, got {message}")));
            }
        }
    }

    /// It has ended and was reaped (lost during a call): start another.
    pub fn is_gone(&self) -> bool {
        self.reaped
    }

    /// As [`Zygote::receive`], but a stopped zygote (a call may SIGSTOP
    /// its parent) is `Frozen` at once rather than `Silent` after `timeout`.
    fn receive_unless_stopped(&self, timeout: Duration) -> Result<(Value, Vec<OwnedFd>), ProcessError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if fd::readable(&self.control, Duration::from_millis(50))? {
                return self.receive(Duration::ZERO);
            }
            if stopped(self.pid) {
                return Err(ProcessError::Frozen);
            }
            if std::time::Instant::now() >= deadline {
                return Err(ProcessError::Silent(timeout.as_secs()));
            }
        }
    }

    /// What became of a zygote lost during a call, in words: `was killed
    /// by SIGKILL`, `was stopped (SIGSTOP or a debugger)`; it is reaped
    /// (killed first when it is still there).
    pub fn lost(&mut self, error: &ProcessError) -> String {
        if matches!(error, ProcessError::Frozen) {
            fd::kill_pidfd(&self.pidfd);
            let _ = self.reap();
            return "was stopped (SIGSTOP or a debugger)".into();
        }
        if !fd::readable(&self.pidfd, Duration::ZERO).unwrap_or(false) {
            fd::kill_pidfd(&self.pidfd);
            let _ = self.reap();
            return format!("stopped answering ({error})");
        }
        match self.reap() {
            Ok(status) => describe_status(status).replacen("killed", "was killed", 1),
            Err(e) => format!("ended ({e})"),
        }
    }

    /// Keeps an `exited` message for [`Zygote::exited`]; false for any other.
    fn stash_exit(&mut self, message: &Value) -> bool {
        match (message["exited"].as_i64(), message["pid"].as_u64(), message["maxrss_kb"].as_u64()) {
            (Some(status), Some(pid), Some(kb)) => {
                self.exits.insert(pid as u32, (status as i32, kb.saturating_mul(1024)));
                true
            }
            _ => false,
        }
    }

    /// Reaps the interpreter once it has exited, after killing what is left
    /// of its process group (it leads one: `setsid` at start): what a call
    /// started and left running dies with it. In the sandbox nothing can
    /// leave the group (seccomp refuses `setpgid` and `setsid`).
    fn reap(&mut self) -> std::io::Result<(i32, u64)> {
        fd::wait_exited(self.pid)?;
        fd::kill_group(self.pid);
        let reaped = fd::wait4(self.pid);
        self.reaped = true;
        reaped
    }
}

impl Drop for Zygote {
    fn drop(&mut self) {
        if !self.reaped {
            // Its children die with it (PR_SET_PDEATHSIG).
            fd::kill_pidfd(&self.pidfd);
            let _ = self.reap();
        }
    }
}

/// Whether the process is stopped (state `T` or `t` in /proc/PID/stat).
fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()))
        .is_some_and(|state| state == 'T' || state == 't')
}

/// A wait status in words: `exited with code 1`, `killed by SIGSEGV`.
pub fn describe_status((status, _): (i32, u64)) -> String {
    if libc::WIFSIGNALED(status) {
        format!("killed by {}", isorun_protocol::signal_name(libc::WTERMSIG(status)))
    } else {
        format!("exited with code {}", libc::WEXITSTATUS(status))
    }
}
