//! Where the worker binary and libtensorflow are. The supervisor passes the
//! library folder to every worker it starts, so nobody sets
//! `LD_LIBRARY_PATH` and the binaries keep working when moved.
//!
//! libtensorflow comes, in this order, from the folder asked for
//! (`--libtensorflow-dir`), the `tensorflow`/`tensorflow-cpu` 2.x package of
//! the Python environment isorun runs in (the wheel's `pip install isorun`
//! beside TensorFlow: its `tensorflow/libtensorflow_cc.so.2`), or the cache
//! that `fetch-libtensorflow` fills. The environment's package is found by
//! looking at files only (its site-packages and `dist-info`), never by
//! starting Python or importing TensorFlow in the supervisor.
//!
//! ONNX Runtime's C library (`libonnxruntime.so.1.N`, N its C API version)
//! is found the same way, for the workers that will run `.onnx` files:
//! `ISORUN_ONNXRUNTIME_DIR`, else the environment's `onnxruntime` package
//! (`onnxruntime/capi/`), else the cache `scripts/fetch-onnxruntime` fills.

use std::fmt;
use std::path::{Path, PathBuf};

/// The TensorFlow version `scripts/fetch-libtensorflow` fetches.
pub const TENSORFLOW_VERSION: &str = "2.21.0";

/// The default cache folder of libtensorflow.
pub fn default_libtensorflow_dir() -> Option<PathBuf> {
    default_libtensorflow_dir_for("cpu")
}

/// The cache folder of one build of libtensorflow: `cpu`, or `gpu`
/// (`scripts/fetch-libtensorflow --gpu`, with the CUDA libraries in `cuda/`).
pub fn default_libtensorflow_dir_for(variant: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(cache.join("isorun").join(format!("libtensorflow-{TENSORFLOW_VERSION}-{variant}")))
}

/// Where zygotes keep the index of oneDNN's sgemm in each libtensorflow
/// they load (the worker's `symbol_index.rs`): `ISORUN_SYMBOL_CACHE`, else
/// `isorun/symbols` in the cache folder.
pub fn symbol_cache_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os(isorun_protocol::ENV_SYMBOL_CACHE).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(cache.join("isorun").join("symbols"))
}

/// The two libraries a libtensorflow folder must hold.
const LIBRARIES: [&str; 2] = ["libtensorflow_cc.so.2", "libtensorflow_framework.so.2"];

/// The TensorFlow distributions whose wheels carry the C API libraries in
/// `tensorflow/` (their `dist-info` names, normalized).
const TENSORFLOW_DISTRIBUTIONS: [&str; 4] = ["tensorflow", "tensorflow_cpu", "tensorflow_intel", "tensorflow_gpu"];

/// How to fill the cache, for messages.
const FETCH: &str = "python -m isorun fetch-libtensorflow, or scripts/fetch-libtensorflow in a clone";

/// Where a libtensorflow folder came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibtensorflowOrigin {
    /// `--libtensorflow-dir` or `ISORUN_LIBTENSORFLOW_DIR`.
    Asked,
    /// The `tensorflow` package of a Python environment.
    PythonPackage(TensorflowPackage),
    /// The cache of `fetch-libtensorflow`.
    Cache,
}

/// An installed TensorFlow wheel that carries libtensorflow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorflowPackage {
    /// The distribution as pip names it: `tensorflow-cpu`, `tensorflow`.
    pub distribution: String,
    /// Its version, from `dist-info/METADATA` (`None` if unreadable).
    pub version: Option<String>,
    /// The site-packages folder it is installed in.
    pub site_packages: PathBuf,
}

impl TensorflowPackage {
    /// Whether its major version is 2, the C API the worker is built against.
    pub fn is_2x(&self) -> bool {
        self.version.as_deref().is_some_and(|v| v.split('.').next() == Some("2"))
    }
}

/// A libtensorflow folder and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundLibtensorflow {
    pub dir: PathBuf,
    pub origin: LibtensorflowOrigin,
}

/// No libtensorflow anywhere isorun looks; its message says where it looked
/// and how to get one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibtensorflowNotFound {
    /// The folder asked for, if any (then nothing else was looked at).
    pub asked: Option<PathBuf>,
    /// TensorFlow packages found but not usable (not 2.x), with why.
    pub unusable: Vec<(TensorflowPackage, &'static str)>,
    /// The site-packages folders looked in.
    pub site_packages: Vec<PathBuf>,
    /// The first `python3` (or `python`) on `PATH`, if any: named when it
    /// gave no site-packages (a pyenv shim or other launcher).
    pub python_on_path: Option<PathBuf>,
    /// The cache folder looked in.
    pub cache: Option<PathBuf>,
}

impl fmt::Display for LibtensorflowNotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(asked) = &self.asked {
            return write!(
                f,
                "no libtensorflow in {} (--libtensorflow-dir or ISORUN_LIBTENSORFLOW_DIR): it holds no {}; name a \
                 folder that does, or leave it unset to use the Python environment's TensorFlow or the cache \
                 ({FETCH})",
                asked.display(),
                LIBRARIES.join(" and ")
            );
        }
        f.write_str("no libtensorflow found: ")?;
        for (package, why) in &self.unusable {
            write!(
                f,
                "{} {} in {} {why}; ",
                package.distribution,
                package.version.as_deref().unwrap_or("(version unknown)"),
                package.site_packages.display()
            )?;
        }
        if self.site_packages.is_empty() {
            match &self.python_on_path {
                Some(python) => write!(
                    f,
                    "no Python environment found (none around this executable, no VIRTUAL_ENV or CONDA_PREFIX, and \
                     no lib/python3*/site-packages beside {}, the python3 on PATH: a pyenv shim or other launcher \
                     is not followed; set VIRTUAL_ENV to the environment's folder); ",
                    python.display()
                )?,
                None => f.write_str(
                    "no Python environment found (none around this executable, no VIRTUAL_ENV or CONDA_PREFIX, no \
                     python3 on PATH); ",
                )?,
            }
        } else if self.unusable.is_empty() {
            let folders: Vec<String> = self.site_packages.iter().map(|p| p.display().to_string()).collect();
            write!(f, "no tensorflow or tensorflow-cpu package in {}; ", folders.join(", "))?;
        }
        match &self.cache {
            Some(cache) => write!(f, "nothing in the cache {}; ", cache.display())?,
            None => f.write_str("no cache folder (neither XDG_CACHE_HOME nor HOME is set); ")?,
        }
        write!(f, "install TensorFlow 2.x into this Python environment (pip install tensorflow-cpu), or fill the cache ({FETCH})")
    }
}

impl std::error::Error for LibtensorflowNotFound {}

/// The libtensorflow folder to give workers: the one asked for, else the
/// Python environment's TensorFlow package, else the default cache, if it
/// holds the library.
pub fn libtensorflow_dir(asked: Option<&Path>) -> Option<PathBuf> {
    find_libtensorflow(asked).ok().map(|found| found.dir)
}

/// The libtensorflow folder to give workers, and where it came from; or
/// where isorun looked. A folder asked for is the only one looked at.
pub fn find_libtensorflow(asked: Option<&Path>) -> Result<FoundLibtensorflow, LibtensorflowNotFound> {
    let holds_libraries = |dir: &Path| LIBRARIES.iter().all(|name| dir.join(name).exists());
    if let Some(asked) = asked {
        return if holds_libraries(asked) {
            Ok(FoundLibtensorflow { dir: asked.to_path_buf(), origin: LibtensorflowOrigin::Asked })
        } else {
            Err(LibtensorflowNotFound {
                asked: Some(asked.to_path_buf()),
                unusable: Vec::new(),
                site_packages: Vec::new(),
                python_on_path: None,
                cache: None,
            })
        };
    }
    let site_packages = site_packages_folders(&python_prefixes());
    let mut unusable = Vec::new();
    for folder in &site_packages {
        let Some(package) = tensorflow_package(folder) else { continue };
        if package.is_2x() {
            return Ok(FoundLibtensorflow {
                dir: folder.join("tensorflow"),
                origin: LibtensorflowOrigin::PythonPackage(package),
            });
        }
        unusable.push((package, "is not TensorFlow 2.x"));
    }
    let cache = default_libtensorflow_dir();
    match cache.as_deref() {
        Some(dir) if holds_libraries(dir) => {
            Ok(FoundLibtensorflow { dir: dir.to_path_buf(), origin: LibtensorflowOrigin::Cache })
        }
        _ => {
            Err(LibtensorflowNotFound { asked: None, unusable, site_packages, python_on_path: python_on_path(), cache })
        }
    }
}

/// The prefixes of the Python environments isorun may be running in, first
/// the likeliest, without duplicates: the one this executable is installed
/// in (`<prefix>/bin/isorun`, as `pip install` puts it), `VIRTUAL_ENV`,
/// `CONDA_PREFIX`, then that of the first `python3` (or `python`) on `PATH`.
pub fn python_prefixes() -> Vec<PathBuf> {
    let mut prefixes: Vec<PathBuf> = Vec::new();
    let mut add = |prefix: Option<PathBuf>| {
        if let Some(prefix) = prefix.filter(|p| p.is_dir()) {
            if !prefixes.contains(&prefix) {
                prefixes.push(prefix);
            }
        }
    };
    let of_bin_folder = |program: &Path| {
        let bin = program.parent()?;
        if bin.file_name()? != "bin" {
            return None;
        }
        bin.parent().map(Path::to_path_buf)
    };
    add(std::env::current_exe().ok().as_deref().and_then(of_bin_folder));
    for name in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        add(std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from));
    }
    add(python_on_path().as_deref().and_then(of_bin_folder));
    prefixes
}

/// The first `python3` (or `python`) on `PATH`.
fn python_on_path() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find_map(|dir| ["python3", "python"].iter().map(|name| dir.join(name)).find(|p| p.is_file()))
}

/// The site-packages folders of these prefixes: `lib/python3.*/site-packages`
/// (and `dist-packages`, `lib64`, Debian's `lib/python3/dist-packages`),
/// then the user's own (`~/.local/lib/python3.*/site-packages`).
pub fn site_packages_folders(prefixes: &[PathBuf]) -> Vec<PathBuf> {
    let user = std::env::var_os("HOME").map(|home| Path::new(&home).join(".local"));
    let mut folders = Vec::new();
    for prefix in prefixes.iter().chain(user.as_ref()) {
        for lib in ["lib", "lib64"] {
            let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else { continue };
            let mut pythons: Vec<PathBuf> = entries
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
                .map(|e| e.path())
                .collect();
            pythons.sort();
            for python in pythons {
                for name in ["site-packages", "dist-packages"] {
                    // A venv's lib64 is a link to lib: the same folder once.
                    let folder = python.join(name);
                    let canonical = folder.canonicalize().ok();
                    let seen = folders.iter().any(|f: &PathBuf| f.canonicalize().ok() == canonical);
                    if folder.is_dir() && !seen {
                        folders.push(folder);
                    }
                }
            }
        }
    }
    folders
}

/// The TensorFlow wheel installed in `site_packages` whose `tensorflow/`
/// folder holds the C API libraries, read from its `dist-info` (never imported).
pub fn tensorflow_package(site_packages: &Path) -> Option<TensorflowPackage> {
    let libraries = site_packages.join("tensorflow");
    if !LIBRARIES.iter().all(|name| libraries.join(name).is_file()) {
        return None;
    }
    let mut dist_infos: Vec<(String, PathBuf)> = std::fs::read_dir(site_packages)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let stem = name.strip_suffix(".dist-info")?;
            let (distribution, _version) = stem.split_once('-')?;
            let normalized = distribution.to_ascii_lowercase().replace(['-', '.'], "_");
            TENSORFLOW_DISTRIBUTIONS.contains(&normalized.as_str()).then(|| (normalized, e.path()))
        })
        .collect();
    // The CPU wheel before the others, for a stable choice when several are installed.
    dist_infos.sort_by_key(|(name, _)| (name != "tensorflow_cpu", name.clone()));
    let (distribution, version) = match dist_infos.first() {
        Some((name, dist_info)) => {
            let metadata = std::fs::read_to_string(dist_info.join("METADATA")).unwrap_or_default();
            let version = metadata.lines().find_map(|l| l.strip_prefix("Version:")).map(|v| v.trim().to_string());
            (name.replace('_', "-"), version)
        }
        None => ("tensorflow".to_string(), None),
    };
    Some(TensorflowPackage { distribution, version, site_packages: site_packages.to_path_buf() })
}

/// The ONNX Runtime version `scripts/fetch-onnxruntime` fetches.
pub const ONNXRUNTIME_VERSION: &str = "1.32.0";

/// The oldest C API the worker speaks: `ort` is built with `api-17`, so a
/// library older than ONNX Runtime 1.17 has no API table for it.
pub const ONNXRUNTIME_MIN_API: u32 = 17;

/// The environment variable naming a folder that holds `libonnxruntime.so.1.N`.
pub const ENV_ONNXRUNTIME_DIR: &str = "ISORUN_ONNXRUNTIME_DIR";

/// How to fill the ONNX Runtime cache, for messages.
const FETCH_ONNXRUNTIME: &str = "scripts/fetch-onnxruntime in a clone";

/// The cache folder `scripts/fetch-onnxruntime` fills.
pub fn default_onnxruntime_dir() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
    Some(cache.join("isorun").join(format!("onnxruntime-{ONNXRUNTIME_VERSION}")))
}

/// Where the ONNX Runtime library came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnnxruntimeOrigin {
    /// `ISORUN_ONNXRUNTIME_DIR`.
    Asked,
    /// The `onnxruntime` (or `onnxruntime-gpu`, ...) package of a Python environment.
    PythonPackage(OnnxruntimePackage),
    /// The cache of `fetch-onnxruntime`.
    Cache,
}

/// An installed ONNX Runtime wheel that carries `libonnxruntime.so.1.N`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnnxruntimePackage {
    /// The distribution as pip names it: `onnxruntime`, `onnxruntime-gpu`.
    pub distribution: String,
    /// Its version, from `dist-info/METADATA` (`None` if unreadable).
    pub version: Option<String>,
    /// The site-packages folder it is installed in.
    pub site_packages: PathBuf,
}

/// The ONNX Runtime library workers will load, and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundOnnxruntime {
    /// The library file, `…/libonnxruntime.so.1.N[.P]`.
    pub library: PathBuf,
    /// Its C API version: the N of its file name.
    pub api_version: u32,
    /// Its full version where known: from the file name (`1.32.0`), the
    /// package's `dist-info` or the cache's `.complete` marker.
    pub version: Option<String>,
    pub origin: OnnxruntimeOrigin,
}

impl FoundOnnxruntime {
    /// Why workers cannot use this library, when its C API is older than
    /// `ONNXRUNTIME_MIN_API`: said once, before any worker, rather than
    /// as every unit's failure to open it.
    pub fn too_old(&self) -> Option<String> {
        if self.api_version >= ONNXRUNTIME_MIN_API {
            return None;
        }
        let version = self.version.clone().unwrap_or_else(|| format!("1.{}", self.api_version));
        let fix = match &self.origin {
            OnnxruntimeOrigin::Asked => format!("name a folder with a newer one in {ENV_ONNXRUNTIME_DIR}"),
            OnnxruntimeOrigin::PythonPackage(package) => {
                format!("pip install -U {} in this Python environment", package.distribution)
            }
            OnnxruntimeOrigin::Cache => format!("fill the cache again ({FETCH_ONNXRUNTIME})"),
        };
        Some(format!(
            "ONNX Runtime {version} at {} speaks C API {}, older than the {ONNXRUNTIME_MIN_API} isorun's worker \
             needs (ONNX Runtime 1.{ONNXRUNTIME_MIN_API} or later): {fix}",
            self.library.display(),
            self.api_version
        ))
    }

    /// ONNX Runtime's CUDA provider library beside this one
    /// (`libonnxruntime_providers_cuda.so`: the `onnxruntime-gpu` wheel has
    /// it, the CPU wheel does not), looked for without loading anything.
    pub fn cuda_provider(&self) -> Option<PathBuf> {
        let provider = self.library.parent()?.join("libonnxruntime_providers_cuda.so");
        provider.is_file().then_some(provider)
    }
}

/// No ONNX Runtime anywhere isorun looks; its message says where it looked
/// and how to get one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnnxruntimeNotFound {
    /// `ISORUN_ONNXRUNTIME_DIR`, if set (then nothing else was looked at).
    pub asked: Option<PathBuf>,
    /// The site-packages folders looked in.
    pub site_packages: Vec<PathBuf>,
    /// The cache folder looked in.
    pub cache: Option<PathBuf>,
    /// Whether the cache holds a library but no `.complete` marker (a fetch
    /// cut short).
    pub cache_incomplete: bool,
}

impl fmt::Display for OnnxruntimeNotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(asked) = &self.asked {
            return write!(
                f,
                "no ONNX Runtime in {} ({ENV_ONNXRUNTIME_DIR}): it holds no libonnxruntime.so.1.N; name a folder \
                 that does, or unset it to use the Python environment's onnxruntime package or the cache \
                 ({FETCH_ONNXRUNTIME})",
                asked.display()
            );
        }
        f.write_str("no ONNX Runtime found: ")?;
        if self.site_packages.is_empty() {
            f.write_str(
                "no Python environment found (none around this executable, no VIRTUAL_ENV or CONDA_PREFIX, no \
                 site-packages beside the python3 on PATH); ",
            )?;
        } else {
            let folders: Vec<String> = self.site_packages.iter().map(|p| p.display().to_string()).collect();
            write!(f, "no onnxruntime package with capi/libonnxruntime.so.1.N in {}; ", folders.join(", "))?;
        }
        match (&self.cache, self.cache_incomplete) {
            (Some(cache), true) => {
                write!(f, "the cache {} has no .complete marker (a fetch cut short); ", cache.display())?
            }
            (Some(cache), false) => write!(f, "nothing in the cache {}; ", cache.display())?,
            (None, _) => f.write_str("no cache folder (neither XDG_CACHE_HOME nor HOME is set); ")?,
        }
        write!(
            f,
            "{ENV_ONNXRUNTIME_DIR} is unset; install onnxruntime into this Python environment (pip install \
             onnxruntime), or fill the cache ({FETCH_ONNXRUNTIME})"
        )
    }
}

impl std::error::Error for OnnxruntimeNotFound {}

/// The ONNX Runtime library for workers: from `ISORUN_ONNXRUNTIME_DIR` (the
/// only place looked at when set), else the `onnxruntime` package of the
/// Python environment isorun runs in, else the `fetch-onnxruntime` cache.
pub fn onnxruntime_library() -> Result<FoundOnnxruntime, OnnxruntimeNotFound> {
    let asked = std::env::var_os(ENV_ONNXRUNTIME_DIR).filter(|v| !v.is_empty()).map(PathBuf::from);
    let site_packages = if asked.is_some() { Vec::new() } else { site_packages_folders(&python_prefixes()) };
    find_onnxruntime(asked.as_deref(), &site_packages, default_onnxruntime_dir().as_deref())
}

/// [`onnxruntime_library`] for a given folder asked for, site-packages
/// folders and cache folder.
pub fn find_onnxruntime(
    asked: Option<&Path>,
    site_packages: &[PathBuf],
    cache: Option<&Path>,
) -> Result<FoundOnnxruntime, OnnxruntimeNotFound> {
    let found = |(library, api_version): (PathBuf, u32), version: Option<String>, origin| {
        let version = full_version_of(&library).or(version);
        FoundOnnxruntime { library, api_version, version, origin }
    };
    if let Some(asked) = asked {
        return match onnxruntime_library_in(asked) {
            Some(library) => Ok(found(library, None, OnnxruntimeOrigin::Asked)),
            None => Err(OnnxruntimeNotFound {
                asked: Some(asked.to_path_buf()),
                site_packages: Vec::new(),
                cache: None,
                cache_incomplete: false,
            }),
        };
    }
    for folder in site_packages {
        let Some(library) = onnxruntime_library_in(&folder.join("onnxruntime").join("capi")) else { continue };
        let package = onnxruntime_package(folder);
        return Ok(found(library, package.version.clone(), OnnxruntimeOrigin::PythonPackage(package)));
    }
    if let Some(dir) = cache {
        let library = onnxruntime_library_in(dir);
        let marker = std::fs::read_to_string(dir.join(".complete")).ok();
        if let (Some(library), Some(marker)) = (library.clone(), marker) {
            let version = Some(marker.trim().to_string()).filter(|v| !v.is_empty());
            return Ok(found(library, version, OnnxruntimeOrigin::Cache));
        }
        return Err(OnnxruntimeNotFound {
            asked: None,
            site_packages: site_packages.to_vec(),
            cache: Some(dir.to_path_buf()),
            cache_incomplete: library.is_some(),
        });
    }
    Err(OnnxruntimeNotFound {
        asked: None,
        site_packages: site_packages.to_vec(),
        cache: None,
        cache_incomplete: false,
    })
}

/// The C API version N of a file named `libonnxruntime.so.1.N` or
/// `libonnxruntime.so.1.N.P`; `None` for any other name.
pub fn onnxruntime_api_version(file_name: &str) -> Option<u32> {
    let rest = file_name.strip_prefix("libonnxruntime.so.1.")?;
    let mut parts = rest.split('.');
    let api = parts.next()?;
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    if !digits(api) || !parts.all(digits) {
        return None;
    }
    api.parse().ok()
}

/// `1.32.0` from `libonnxruntime.so.1.32.0`; `None` where the name has no patch number.
fn full_version_of(library: &Path) -> Option<String> {
    let version = library.file_name()?.to_str()?.strip_prefix("libonnxruntime.so.")?;
    (version.split('.').count() >= 3).then(|| version.to_string())
}

/// The `libonnxruntime.so.1.N` file in `dir` (the highest N where several
/// are), and N.
fn onnxruntime_library_in(dir: &Path) -> Option<(PathBuf, u32)> {
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            let api = onnxruntime_api_version(&name)?;
            let path = e.path();
            path.is_file().then_some((api, name, path))
        })
        .max()
        .map(|(api, _, path)| (path, api))
}

/// The ONNX Runtime distribution installed in `site_packages`, read from its
/// `dist-info` (`onnxruntime`, `onnxruntime-gpu`, ...; never imported).
fn onnxruntime_package(site_packages: &Path) -> OnnxruntimePackage {
    let mut dist_infos: Vec<(String, PathBuf)> = std::fs::read_dir(site_packages)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (distribution, _version) = name.strip_suffix(".dist-info")?.split_once('-')?;
            let normalized = distribution.to_ascii_lowercase().replace(['-', '.'], "_");
            (normalized == "onnxruntime" || normalized.starts_with("onnxruntime_")).then(|| (normalized, e.path()))
        })
        .collect();
    dist_infos.sort();
    let (distribution, version) = match dist_infos.first() {
        Some((name, dist_info)) => {
            let metadata = std::fs::read_to_string(dist_info.join("METADATA")).unwrap_or_default();
            let version = metadata.lines().find_map(|l| l.strip_prefix("Version:")).map(|v| v.trim().to_string());
            (name.replace('_', "-"), version)
        }
        None => ("onnxruntime".to_string(), None),
    };
    OnnxruntimePackage { distribution, version, site_packages: site_packages.to_path_buf() }
}

/// The worker binary: the one asked for, else `ISORUN_WORKER`, else
/// `isorun-worker` next to this executable; for a program cargo built into
/// `target/<profile>/examples/` or `deps/` (an embedding example), one
/// folder up, then in `target/release/` (`scripts/demo` builds only that).
pub fn worker_binary(asked: Option<&Path>) -> Result<PathBuf, String> {
    let from_env = std::env::var_os("ISORUN_WORKER").filter(|v| !v.is_empty()).map(PathBuf::from);
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable's folder: {e}"))?;
    worker_binary_for(asked, from_env.as_deref(), &exe)
}

/// [`worker_binary`] for a given environment variable and executable.
fn worker_binary_for(asked: Option<&Path>, from_env: Option<&Path>, exe: &Path) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = match asked.or(from_env) {
        Some(path) => vec![path.to_path_buf()],
        None => {
            let mut candidates = vec![exe.with_file_name("isorun-worker")];
            let in_cargo_subfolder =
                exe.parent().and_then(Path::file_name).is_some_and(|name| name == "examples" || name == "deps");
            if let (true, Some(profile)) = (in_cargo_subfolder, exe.parent().and_then(Path::parent)) {
                candidates.push(profile.join("isorun-worker"));
                if let Some(target) = profile.parent().filter(|_| profile.file_name().is_some_and(|n| n != "release")) {
                    candidates.push(target.join("release").join("isorun-worker"));
                }
            }
            candidates
        }
    };
    if let Some(found) = candidates.iter().find(|path| path.is_file()) {
        return Ok(found.clone());
    }
    let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "worker binary not found at {}; build it (cargo build -p isorun-worker) or name one with --worker / ISORUN_WORKER",
        looked.join(" or ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn install_tensorflow(site_packages: &Path, dist_info: &str, version: &str) {
        std::fs::create_dir_all(site_packages.join("tensorflow")).unwrap();
        for name in LIBRARIES {
            std::fs::write(site_packages.join("tensorflow").join(name), b"").unwrap();
        }
        std::fs::create_dir_all(site_packages.join(dist_info)).unwrap();
        std::fs::write(
            site_packages.join(dist_info).join("METADATA"),
            format!("Metadata-Version: 2.1\nName: x\nVersion: {version}\n"),
        )
        .unwrap();
    }

    #[test]
    fn a_wheel_is_found_by_its_libraries_and_named_by_its_dist_info() {
        let prefix = tempfile::tempdir().unwrap();
        let site = prefix.path().join("lib/python3.11/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        assert_eq!(site_packages_folders(&[prefix.path().to_path_buf()]).first(), Some(&site));
        assert_eq!(tensorflow_package(&site), None, "no tensorflow folder");
        install_tensorflow(&site, "tensorflow_cpu-2.21.0.dist-info", "2.21.0");
        let package = tensorflow_package(&site).unwrap();
        assert_eq!(package.distribution, "tensorflow-cpu");
        assert_eq!(package.version.as_deref(), Some("2.21.0"));
        assert!(package.is_2x());
        std::fs::remove_file(site.join("tensorflow/libtensorflow_framework.so.2")).unwrap();
        assert_eq!(tensorflow_package(&site), None, "one library missing");
    }

    #[test]
    fn only_2x_counts_and_the_message_says_what_to_do() {
        let site = tempfile::tempdir().unwrap();
        install_tensorflow(site.path(), "tensorflow-1.15.5.dist-info", "1.15.5");
        let package = tensorflow_package(site.path()).unwrap();
        assert!(!package.is_2x());
        let missing = LibtensorflowNotFound {
            asked: None,
            unusable: vec![(package, "is not TensorFlow 2.x")],
            site_packages: vec![site.path().to_path_buf()],
            python_on_path: None,
            cache: Some(PathBuf::from("/cache/libtensorflow-2.21.0-cpu")),
        };
        let text = missing.to_string();
        assert!(text.contains("tensorflow 1.15.5 in") && text.contains("is not TensorFlow 2.x"), "{text}");
        assert!(text.contains("nothing in the cache /cache/libtensorflow-2.21.0-cpu"), "{text}");
        assert!(text.contains("pip install tensorflow-cpu") && text.contains("fetch-libtensorflow"), "{text}");
    }

    /// A python3 on PATH that gives no site-packages (a pyenv shim) is
    /// named, not denied: the message said "no python3 on PATH" while
    /// doctor's keras line named that very python3.
    #[test]
    fn a_python3_on_path_without_site_packages_is_named_not_denied() {
        let missing = LibtensorflowNotFound {
            asked: None,
            unusable: Vec::new(),
            site_packages: Vec::new(),
            python_on_path: Some(PathBuf::from("/root/.pyenv/shims/python3")),
            cache: Some(PathBuf::from("/cache/libtensorflow-2.21.0-cpu")),
        };
        let text = missing.to_string();
        assert!(!text.contains("no python3 on PATH"), "{text}");
        assert!(text.contains("beside /root/.pyenv/shims/python3, the python3 on PATH"), "{text}");
        assert!(text.contains("set VIRTUAL_ENV"), "{text}");
        let none = LibtensorflowNotFound { python_on_path: None, ..missing };
        assert!(none.to_string().contains("no python3 on PATH"), "{none}");
    }

    /// Where a program finds the worker: the one asked for, else
    /// ISORUN_WORKER, else beside it; cargo's examples also one folder up
    /// and in target/release, where the demo builds it.
    #[test]
    fn the_worker_is_asked_for_from_the_environment_beside_or_in_target_release() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path();
        for dir in ["debug/examples", "release"] {
            std::fs::create_dir_all(target.join(dir)).unwrap();
        }
        let example = target.join("debug/examples/embed");
        let release_worker = target.join("release/isorun-worker");
        // Nothing built: the error names every place looked at and how to name one.
        let error = worker_binary_for(None, None, &example).unwrap_err();
        for place in ["debug/examples/isorun-worker", "debug/isorun-worker", "release/isorun-worker", "ISORUN_WORKER"] {
            assert!(error.contains(place), "{place}: {error}");
        }
        // After scripts/demo: only the release build.
        std::fs::write(&release_worker, b"").unwrap();
        assert_eq!(worker_binary_for(None, None, &example).unwrap(), release_worker);
        // A debug worker of the example's own profile comes first.
        std::fs::write(target.join("debug/isorun-worker"), b"").unwrap();
        assert_eq!(worker_binary_for(None, None, &example).unwrap(), target.join("debug/isorun-worker"));
        // ISORUN_WORKER wins over every guess, and --worker over it.
        let named = tmp.path().join("my-worker");
        std::fs::write(&named, b"").unwrap();
        assert_eq!(worker_binary_for(None, Some(&named), &example).unwrap(), named);
        assert_eq!(worker_binary_for(Some(&release_worker), Some(&named), &example).unwrap(), release_worker);
        let error = worker_binary_for(None, Some(Path::new("/nonexistent/w")), &example).unwrap_err();
        assert!(error.starts_with("worker binary not found at /nonexistent/w;"), "{error}");
        // A program outside cargo's subfolders looks only beside itself.
        let installed = target.join("release/isorun");
        assert_eq!(worker_binary_for(None, None, &installed).unwrap(), release_worker);
        assert!(worker_binary_for(None, None, &tmp.path().join("bin/isorun")).is_err());
    }

    #[test]
    fn a_folder_asked_for_is_the_only_one_looked_at() {
        let empty = tempfile::tempdir().unwrap();
        let missing = find_libtensorflow(Some(empty.path())).unwrap_err();
        assert_eq!(missing.asked.as_deref(), Some(empty.path()));
        assert!(missing.to_string().contains("holds no libtensorflow_cc.so.2"), "{missing}");
        install_tensorflow(empty.path(), "unused.dist-info", "2.0.0");
        let found = find_libtensorflow(Some(&empty.path().join("tensorflow"))).unwrap();
        assert_eq!(found.origin, LibtensorflowOrigin::Asked);
    }

    /// A fake ONNX Runtime library file `name` in `dir`.
    fn fake_library(dir: &Path, name: &str) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(name), b"").unwrap();
        dir.join(name)
    }

    #[test]
    fn the_c_api_version_is_read_from_the_file_name() {
        assert_eq!(onnxruntime_api_version("libonnxruntime.so.1.23"), Some(23));
        assert_eq!(onnxruntime_api_version("libonnxruntime.so.1.32.0"), Some(32));
        for name in ["libonnxruntime.so", "libonnxruntime.so.1", "libonnxruntime.so.2.1", "libonnxruntime.so.1.x"] {
            assert_eq!(onnxruntime_api_version(name), None, "{name}");
        }
        assert_eq!(onnxruntime_api_version("libonnxruntime.so.1.32.0.bak~"), None);
    }

    /// A library older than C API 17 is found, and said too old with the
    /// fix for where it came from; 17 and later are not.
    #[test]
    fn an_onnxruntime_older_than_the_worker_s_c_api_is_said_too_old_with_its_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let site = tmp.path().join("site-packages");
        fake_library(&site.join("onnxruntime/capi"), "libonnxruntime.so.1.16.3");
        let found = find_onnxruntime(None, std::slice::from_ref(&site), None).unwrap();
        let why = found.too_old().expect("1.16 is too old");
        assert!(why.starts_with("ONNX Runtime 1.16.3 at "), "{why}");
        assert!(why.contains("speaks C API 16, older than the 17 isorun's worker needs"), "{why}");
        assert!(why.ends_with("pip install -U onnxruntime in this Python environment"), "{why}");
        let asked = tmp.path().join("asked");
        fake_library(&asked, "libonnxruntime.so.1.16");
        let why = find_onnxruntime(Some(&asked), &[], None).unwrap().too_old().unwrap();
        assert!(why.starts_with("ONNX Runtime 1.16 at ") && why.ends_with("in ISORUN_ONNXRUNTIME_DIR"), "{why}");
        for name in ["libonnxruntime.so.1.17.0", "libonnxruntime.so.1.32.0"] {
            let dir = tmp.path().join(name);
            fake_library(&dir, name);
            assert_eq!(find_onnxruntime(Some(&dir), &[], None).unwrap().too_old(), None, "{name}");
        }
    }

    /// ISORUN_ONNXRUNTIME_DIR, else the environment's onnxruntime package,
    /// else the cache, and the cache only once `.complete` is there.
    #[test]
    fn onnxruntime_comes_from_the_folder_asked_the_package_then_the_complete_cache() {
        let tmp = tempfile::tempdir().unwrap();
        let asked = tmp.path().join("asked");
        let site = tmp.path().join("lib/python3.11/site-packages");
        let cache = tmp.path().join("cache/onnxruntime-1.32.0");
        std::fs::create_dir_all(&site).unwrap();
        let sites = [site.clone()];

        // Nothing anywhere: the message names every place and the fix.
        let missing = find_onnxruntime(None, &sites, Some(&cache)).unwrap_err();
        let text = missing.to_string();
        for place in [site.display().to_string(), cache.display().to_string()] {
            assert!(text.contains(&place), "{place}: {text}");
        }
        assert!(text.contains("ISORUN_ONNXRUNTIME_DIR") && text.contains("scripts/fetch-onnxruntime"), "{text}");

        // A cache whose fetch was cut short (no .complete) is not used.
        let cached = fake_library(&cache, "libonnxruntime.so.1.32.0");
        let missing = find_onnxruntime(None, &sites, Some(&cache)).unwrap_err();
        assert!(missing.cache_incomplete);
        assert!(missing.to_string().contains("has no .complete marker"), "{missing}");
        std::fs::write(cache.join(".complete"), "1.32.0\n").unwrap();
        let found = find_onnxruntime(None, &sites, Some(&cache)).unwrap();
        assert_eq!((found.library, found.api_version, found.origin), (cached.clone(), 32, OnnxruntimeOrigin::Cache));
        assert_eq!(found.version.as_deref(), Some("1.32.0"));

        // The environment's package comes before the cache.
        let packaged = fake_library(&site.join("onnxruntime/capi"), "libonnxruntime.so.1.23");
        fake_library(&site.join("onnxruntime-1.23.2.dist-info"), "METADATA");
        std::fs::write(site.join("onnxruntime-1.23.2.dist-info/METADATA"), "Name: onnxruntime\nVersion: 1.23.2\n")
            .unwrap();
        let found = find_onnxruntime(None, &sites, Some(&cache)).unwrap();
        assert_eq!((&found.library, found.api_version), (&packaged, 23));
        assert_eq!(found.version.as_deref(), Some("1.23.2"));
        let OnnxruntimeOrigin::PythonPackage(package) = &found.origin else { panic!("{found:?}") };
        assert_eq!((package.distribution.as_str(), package.site_packages.as_path()), ("onnxruntime", site.as_path()));

        // A folder asked for wins, and is the only one looked at.
        std::fs::create_dir_all(&asked).unwrap();
        let missing = find_onnxruntime(Some(&asked), &sites, Some(&cache)).unwrap_err();
        let text = missing.to_string();
        assert!(
            text.starts_with(&format!("no ONNX Runtime in {} (ISORUN_ONNXRUNTIME_DIR)", asked.display())),
            "{text}"
        );
        assert!(text.contains("scripts/fetch-onnxruntime"), "{text}");
        fake_library(&asked, "libonnxruntime.so.1.31.1");
        let chosen = fake_library(&asked, "libonnxruntime.so.1.32.0");
        let found = find_onnxruntime(Some(&asked), &sites, Some(&cache)).unwrap();
        assert_eq!((found.library, found.api_version, found.origin), (chosen, 32, OnnxruntimeOrigin::Asked));
        assert_eq!(found.version.as_deref(), Some("1.32.0"), "from the file name");
    }

    #[test]
    fn without_a_python_environment_the_message_says_so() {
        let missing =
            OnnxruntimeNotFound { asked: None, site_packages: Vec::new(), cache: None, cache_incomplete: false };
        let text = missing.to_string();
        assert!(text.contains("no Python environment found"), "{text}");
        assert!(text.contains("neither XDG_CACHE_HOME nor HOME is set"), "{text}");
        assert!(text.ends_with("fill the cache (scripts/fetch-onnxruntime in a clone)"), "{text}");
    }
}
