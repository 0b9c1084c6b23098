//! Confines a worker before it loads a model or starts a thread: a
//! SavedModel is a program (its graph may hold `ReadFile`, `WriteFile`,
//! `MatchingFiles`...), and isorun runs models from many hands. A crate of
//! its own so that the real worker and the test suite's fault worker apply
//! the very same sandbox, and the tests attack the real one.
//!
//! In force where the kernel allows, each reported by name: `landlock`
//! (read only beneath the models, libtensorflow, system libraries and the
//! few named files TensorFlow reads; write nothing but `/dev/null`),
//! `signal_scope` and `abstract_unix_scope` (Landlock ABI 6, Linux 6.12: no
//! signal to, and no connection to an abstract UNIX socket of, any process
//! outside the worker's own Landlock domain; on older kernels seccomp's
//! `signal_filter` lets it signal only itself), `no_unix_sockets` (seccomp:
//! no new `AF_UNIX` socket, so no connection to a pathname socket such as
//! `/run/user/$UID/bus` or `/var/run/docker.sock`, which neither Landlock's
//! file rules nor the network namespace stop), `own_session` (started in
//! a session of its own, which the same filter keeps it in: no `setpgid`,
//! no `setsid`), `no_network` (a new network
//! namespace: no interface but a down loopback), `no_new_privs`,
//! `no_core_dumps`, `clean_env` (an allow-list, [`keeps_user_variable`]:
//! `TF_*`, `ORT_*`, `CUDA_*`, `OMP_*`, `KMP_*`, locale, and the library path
//! isorun sets), `fd_limit`, and `work_dir` (its own empty working
//! folder). Where the worker may see a GPU (`CUDA_VISIBLE_DEVICES` not
//! empty), Landlock also lets it use the `/dev/nvidia*` devices there are.
//! Landlock and seccomp bind this thread and the threads it starts later,
//! which is why this runs before TensorFlow starts any. Whatever cannot be
//! applied is reported as missing, so the supervisor can say so.

use isorun_protocol::SandboxSpec;
mod seccomp;

use landlock::{
    path_beneath_rules, Access, AccessFs, LandlockStatus, RestrictionStatus, Ruleset, RulesetAttr, RulesetCreatedAttr,
    RulesetStatus, Scope, ABI,
};

/// Files TensorFlow and the C library read at run time (named, not whole folders).
const READ_FILES: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/self",
    "/proc/thread-self",
    "/sys/devices/system/cpu",
    "/sys/devices/system/node",
    "/sys/fs/cgroup",
    "/dev/urandom",
    "/dev/random",
    "/dev/zero",
    "/usr/share/zoneinfo",
];

/// System library folders (for `dlopen` of codecs and the like).
const LIBRARY_DIRS: &[&str] = &["/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib"];

/// What CUDA reads about the GPUs, when the worker may use one.
const GPU_READ_PATHS: &[&str] = &["/proc/driver/nvidia", "/sys/bus/pci", "/sys/module/nvidia"];

/// True unless `CUDA_VISIBLE_DEVICES` hides every GPU (isorun sets it empty
/// for workers of a run without `--gpus`). CUDA reads the list up to its
/// first entry that names no device, so it hides them all when the first
/// entry is not an index or a `GPU-`/`MIG-` id (`""`, `-1`, Slurm's
/// `NoDevFiles`). The worker's ONNX sessions decide on CUDA by this too.
pub fn gpu_visible() -> bool {
    std::env::var("CUDA_VISIBLE_DEVICES").map_or(true, |v| names_a_device(&v))
}

/// Whether a `CUDA_VISIBLE_DEVICES` value leaves CUDA a device.
fn names_a_device(value: &str) -> bool {
    let first = value.split(',').next().unwrap_or("").trim();
    first.parse::<u32>().is_ok() || first.starts_with("GPU-") || first.starts_with("MIG-")
}

/// The NVIDIA device files there are (`/dev/nvidiactl`, `/dev/nvidia0`,
/// `/dev/nvidia-uvm`, `/dev/nvidia-caps/`...), and the PCI device folders
/// that `/sys/bus/pci/devices` links point into.
fn gpu_paths() -> (Vec<std::path::PathBuf>, Vec<std::path::PathBuf>) {
    let starting = |folder: &str, prefix: &str| -> Vec<std::path::PathBuf> {
        let Ok(entries) = std::fs::read_dir(folder) else { return Vec::new() };
        entries.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(prefix)).map(|e| e.path()).collect()
    };
    let devices = starting("/dev", "nvidia");
    let mut read: Vec<std::path::PathBuf> = GPU_READ_PATHS.iter().map(Into::into).collect();
    read.extend(starting("/sys/devices", "pci"));
    (devices, read)
}

/// The user's environment variables a sandboxed worker keeps (prefixes and
/// names): the runtimes' own settings (`TF_*`, ONNX Runtime's `ORT_*`,
/// CUDA's, OpenMP's) and the locale. The supervisor clears a sandboxed
/// worker's environment down to these before exec, and the sandbox drops
/// anything else from the live copy.
const USER_ENV_PREFIXES: &[&str] = &["TF_", "ORT_", "CUDA_", "LC_", "OMP_", "KMP_"];
const USER_ENV_NAMES: &[&str] = &["LANG", "LANGUAGE", "TZ"];
/// Variables isorun itself sets for a worker, also kept. `ISORUN_SYMBOL_CACHE`
/// (isorun_protocol::ENV_SYMBOL_CACHE) is the folder of symbol indexes the
/// supervisor gives a zygote even in a cleared environment (its oneDNN
/// warm-up reads it before each fork), and so every worker forked from it:
/// a path isorun chose, not the user's environment.
const ISORUN_ENV_NAMES: &[&str] = &["LD_LIBRARY_PATH", "LD_BIND_NOW", "ISORUN_SYMBOL_CACHE"];

/// Whether a sandboxed worker keeps the user's variable `name`.
pub fn keeps_user_variable(name: &str) -> bool {
    USER_ENV_NAMES.contains(&name) || USER_ENV_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Protections in force, and those that could not be applied.
pub struct Applied {
    pub protections: Vec<String>,
    pub missing: Vec<String>,
    /// How long each step took, in order: `limits_env` (rlimits, the
    /// environment, the working folder), `network` (the namespace),
    /// `landlock` (building and enforcing the ruleset), `seccomp`.
    pub steps: Vec<(&'static str, std::time::Duration)>,
}

/// Applies the sandbox to this process. Must run while single-threaded.
pub fn apply(spec: &SandboxSpec) -> Applied {
    apply_with_writable(spec, &[])
}

/// The same sandbox, for a process that must also write beneath a few
/// folders (the Keras export process: its cache entry's temporary folder).
/// Landlock still refuses every other write; everything else is `apply`'s.
pub fn apply_with_writable(spec: &SandboxSpec, writable: &[std::path::PathBuf]) -> Applied {
    apply_with_options(spec, writable, &Options::default())
}

/// What a caller may keep that a model worker never does.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Keep the network: no new network namespace (`isorun map --network`,
    /// whose calls are the user's code); `no_network` is then not reported.
    pub network: bool,
}

/// `apply_with_writable`, with [`Options`].
pub fn apply_with_options(spec: &SandboxSpec, writable: &[std::path::PathBuf], options: &Options) -> Applied {
    let mut applied = Applied { protections: Vec::new(), missing: Vec::new(), steps: Vec::new() };
    let mut steps = Vec::with_capacity(4);
    let mut step_started = std::time::Instant::now();
    let mut step = |name: &'static str| {
        let now = std::time::Instant::now();
        steps.push((name, now - step_started));
        step_started = now;
    };
    let mut record =
        |name: &str, ok: bool| if ok { &mut applied.protections } else { &mut applied.missing }.push(name.to_string());

    // SAFETY: setrlimit with a valid struct.
    let limit = |resource, value: u64| unsafe {
        let rlimit = libc::rlimit { rlim_cur: value, rlim_max: value };
        libc::setrlimit(resource, &rlimit) == 0
    };
    if !spec.core_dumps {
        record("no_core_dumps", limit(libc::RLIMIT_CORE, 0));
    }
    record("fd_limit", limit(libc::RLIMIT_NOFILE, 4096));

    // Environment: the supervisor starts sandboxed workers with a cleared
    // one (a model can read /proc/self/environ, which no unsetenv changes);
    // report whether it did, and drop anything else from the live copy.
    let keep = |name: &str| ISORUN_ENV_NAMES.contains(&name) || keeps_user_variable(name);
    let mut clean = true;
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if !keep(&name) {
            clean = false;
            // SAFETY: single-threaded here (see the module docs).
            unsafe { std::env::remove_var(&name) };
        }
    }
    record("clean_env", clean);

    if let Some(dir) = &spec.work_dir {
        record("work_dir", std::env::set_current_dir(dir).is_ok());
    }
    step("limits_env");

    // No network: a fresh network namespace (root may; others through a user namespace).
    if !options.network {
        // SAFETY: unshare affects only this process; single-threaded here.
        let no_network = unsafe {
            libc::unshare(libc::CLONE_NEWNET) == 0 || libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) == 0
        };
        record("no_network", no_network);
    }
    step("network");

    // Before Landlock and seccomp, which both need it (and so that a
    // kernel without Landlock still refuses new privileges).
    // SAFETY: prctl with constant arguments.
    record("no_new_privs", unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } == 0);

    let scoped = match restrict_files(spec, writable) {
        Ok(status) => {
            let abi = match status.landlock {
                LandlockStatus::Available { effective_abi, .. } if status.ruleset != RulesetStatus::NotEnforced => {
                    effective_abi
                }
                _ => ABI::Unsupported,
            };
            // Every file right isorun asks for exists from ABI 5 (`IoctlDev`);
            // before it, what the kernel knows is enforced.
            match abi {
                ABI::Unsupported => record("landlock", false),
                abi if abi >= ABI::V5 => record("landlock", true),
                _ => record("landlock_partial", true),
            }
            let scoped = abi >= ABI::V6;
            record("signal_scope", scoped);
            record("abstract_unix_scope", scoped);
            scoped
        }
        Err(_) => {
            record("landlock", false);
            record("signal_scope", false);
            record("abstract_unix_scope", false);
            false
        }
    };
    step("landlock");
    // Without the scope, seccomp keeps signals in (abstract sockets are
    // kept in by `no_unix_sockets` and the network namespace's own names).
    if !scoped {
        record("signal_filter", seccomp::deny_foreign_signals().is_ok());
    }
    // Last: nothing after this may need a new UNIX socket. The worker's
    // only channel to the supervisor is the socket it inherited.
    let filtered = seccomp::deny_unix_sockets().is_ok();
    record("no_unix_sockets", filtered);
    // The same filter keeps it in its session; that session is its own
    // when the supervisor started it so (a worker, spare or exporter).
    // SAFETY: getsid and getpid have no preconditions.
    record("own_session", filtered && unsafe { libc::getsid(0) == libc::getpid() });
    step("seccomp");
    applied.steps = steps;
    applied
}

/// What a launcher execs once [`apply_with_options`] has confined it: the
/// program, its arguments and exactly the environment given, plus
/// `ISORUN_SANDBOX` (the protections in force, less those named in
/// `not_claimed`) and `ISORUN_SANDBOX_MISSING`, so the program can say how
/// it is confined. Landlock, seccomp, the namespace and the limits outlive
/// `execve`. Returns only on failure, with the error.
pub fn exec_confined(
    applied: &Applied,
    not_claimed: &[&str],
    program: &str,
    args: &[String],
    env: &[(String, String)],
) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let mut command = std::process::Command::new(program);
    command.args(args).env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    let protections: Vec<&str> =
        applied.protections.iter().map(String::as_str).filter(|p| !not_claimed.contains(p)).collect();
    command.env("ISORUN_SANDBOX", protections.join(","));
    command.env("ISORUN_SANDBOX_MISSING", applied.missing.join(","));
    command.exec()
}

/// Landlock: the file rules, and the signal and abstract-socket scopes
/// (ABI 6; on older kernels the crate leaves out what they do not know, and
/// the status says how far the kernel went).
fn restrict_files(
    spec: &SandboxSpec,
    writable: &[std::path::PathBuf],
) -> Result<RestrictionStatus, landlock::RulesetError> {
    let abi = ABI::V5;
    let read = AccessFs::from_read(abi);
    let exe = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.to_path_buf()));
    let mut readable: Vec<std::path::PathBuf> = spec.read_paths.iter().map(Into::into).collect();
    readable.extend(READ_FILES.iter().map(Into::into));
    readable.extend(LIBRARY_DIRS.iter().map(Into::into));
    readable.extend(exe);
    readable.extend(std::env::var_os("LD_LIBRARY_PATH").iter().flat_map(std::env::split_paths));
    if let Some(dir) = &spec.work_dir {
        readable.push(dir.into());
    }
    // A GPU the worker may use: its device files read, written and ioctl'd
    // (`IoctlDev`, Landlock ABI 5), and what CUDA reads about it.
    let (gpu_devices, gpu_read) = if gpu_visible() { gpu_paths() } else { (Vec::new(), Vec::new()) };
    readable.extend(gpu_read);
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))?
        .scope(Scope::from_all(ABI::V6))?
        .create()?
        .add_rules(path_beneath_rules(readable, read))?
        .add_rules(path_beneath_rules(["/dev/null"], read | AccessFs::WriteFile))?
        .add_rules(path_beneath_rules(writable, AccessFs::from_all(abi)))?
        .add_rules(path_beneath_rules(gpu_devices, read | AccessFs::WriteFile | AccessFs::IoctlDev))?
        .restrict_self()?;
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::names_a_device;

    /// CUDA's reading of `CUDA_VISIBLE_DEVICES`: the first entry decides.
    #[test]
    fn a_device_list_hides_every_gpu_when_its_first_entry_names_none() {
        for shown in ["0", "1,0", " 2 ", "GPU-5b3c2f1e-aaaa", "MIG-1f2e", "0,-1"] {
            assert!(names_a_device(shown), "{shown:?} leaves a device");
        }
        for hidden in ["", " ", "-1", "-1,0", "NoDevFiles", "none"] {
            assert!(!names_a_device(hidden), "{hidden:?} hides every device");
        }
    }
}
