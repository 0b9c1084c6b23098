//! GPUs: which device each slot's workers see (`--gpus`), and how much of
//! its memory each worker took and gave back, measured through NVML.
//!
//! A slot is bound to one device through `CUDA_VISIBLE_DEVICES` (slot i to
//! device i mod n). NVML and CUDA number devices differently (NVML by PCI
//! bus, CUDA fastest first), so where NVML is present a device is named by
//! its UUID, which both agree on; without NVML the names given are passed
//! on as they are, with `CUDA_DEVICE_ORDER=PCI_BUS_ID` so that an index
//! means what `nvidia-smi` shows. NVML (`libnvidia-ml.so.1`, part of the
//! driver) is loaded at run time, once per run and only when `--gpus` asks
//! for devices; a machine without it is normal, not an error: the workers
//! still run, and their records have no GPU memory fields. Without NVML
//! and without a `/dev/nvidiaN` device there is no GPU to bind
//! ([`nvidia_devices_present`]): the CLI binds none, so records do not name
//! a device the worker never had.

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::{Device, Nvml};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The devices `--gpus` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuList {
    /// Every device NVML lists.
    All,
    /// Device indexes as `nvidia-smi` numbers them, or UUIDs (`GPU-...`, `MIG-...`), in order.
    Devices(Vec<String>),
}

/// Parses `--gpus`: `all`, or a comma-separated list of indexes and UUIDs.
pub fn parse_gpus(text: &str) -> Result<GpuList, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("all") {
        return Ok(GpuList::All);
    }
    let mut devices: Vec<String> = Vec::new();
    for item in text.split(',').map(str::trim) {
        let valid = (!item.is_empty() && item.len() <= 4 && item.bytes().all(|b| b.is_ascii_digit()))
            || ((item.starts_with("GPU-") || item.starts_with("MIG-"))
                && item.len() > 4
                && item.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'/'));
        if !valid {
            return Err(format!(
                "'{item}' is not a device: expected `all`, or indexes and UUIDs separated by commas (0,1 or GPU-...)"
            ));
        }
        let device = match item.parse::<u32>() {
            Ok(index) => index.to_string(), // "00" and "0" are one device
            Err(_) => item.to_string(),
        };
        if devices.contains(&device) {
            return Err(format!("device {device} is named twice (use --workers-per-gpu for more workers per device)"));
        }
        devices.push(device);
    }
    Ok(GpuList::Devices(devices))
}

/// The device of slot `slot` when slots are spread over `devices` (slot i to device i mod n).
pub fn slot_device(devices: &[String], slot: usize) -> Option<&str> {
    (!devices.is_empty()).then(|| devices[slot % devices.len()].as_str())
}

/// How many slots of `jobs` share `device` with slot `slot` (itself included).
pub fn slots_on_device(devices: &[String], jobs: usize, slot: usize) -> usize {
    match slot_device(devices, slot) {
        Some(device) => (0..jobs).filter(|&s| slot_device(devices, s) == Some(device)).count(),
        None => 0,
    }
}

/// Whether this machine shows CUDA an NVIDIA device: a `/dev/nvidiaN` file,
/// which the driver makes for each GPU (and a container is given for each
/// of its GPUs). Without one and without NVML, a worker bound to a device
/// runs on the CPU, and the caller should not record the device as its.
pub fn nvidia_devices_present() -> bool {
    nvidia_device_files(Path::new("/dev"))
}

/// Whether `dev` holds an `nvidiaN` entry (`nvidiactl`, `nvidia-uvm` are not GPUs).
fn nvidia_device_files(dev: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dev) else { return false };
    entries.flatten().any(|entry| {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        name.strip_prefix("nvidia").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// NVML's library, as the driver installs it.
const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// NVML, loaded on first use and kept for the run; `None` where the driver
/// or its library is absent (said once, at debug level).
pub fn nvml() -> Option<&'static Nvml> {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    NVML.get_or_init(|| load_nvml(OsStr::new(NVML_LIBRARY))).as_ref()
}

/// NVML from the library at `library`, or `None` (and why, at debug level).
fn load_nvml(library: &OsStr) -> Option<Nvml> {
    match Nvml::builder().lib_path(library).init() {
        Ok(nvml) => Some(nvml),
        Err(e) => {
            tracing::debug!("NVML is not available ({}): {e}", library.to_string_lossy());
            None
        }
    }
}

/// The names to put in each slot's `CUDA_VISIBLE_DEVICES` for `list`:
/// UUIDs where NVML can say them (checking that each device exists), else
/// the names as given. `all` needs NVML.
pub fn resolve(list: &GpuList, nvml: Option<&Nvml>) -> Result<Vec<String>, String> {
    let Some(nvml) = nvml else {
        return match list {
            GpuList::All => Err(format!(
                "--gpus all: cannot list this machine's GPUs: NVML ({NVML_LIBRARY}, from the NVIDIA driver) is not \
                 available here; name the devices instead (--gpus 0,1)"
            )),
            GpuList::Devices(devices) => Ok(devices.clone()),
        };
    };
    let uuid = |device: Result<Device<'_>, _>, name: &str| {
        device.and_then(|d| d.uuid()).map_err(|e| format!("--gpus: no device {name} here (NVML: {e})"))
    };
    match list {
        GpuList::All => {
            let count = nvml.device_count().map_err(|e| format!("--gpus all: NVML cannot count the devices: {e}"))?;
            if count == 0 {
                return Err("--gpus all: NVML lists no GPU on this machine".into());
            }
            (0..count).map(|i| uuid(nvml.device_by_index(i), &i.to_string())).collect()
        }
        GpuList::Devices(devices) => devices
            .iter()
            .map(|name| match name.parse::<u32>() {
                Ok(index) => uuid(nvml.device_by_index(index), name),
                Err(_) => uuid(nvml.device_by_uuid(name.as_str()), name),
            })
            .collect(),
    }
}

/// A one-line description of a device for logs: `0 (NVIDIA H200, GPU-...)`.
pub fn describe(nvml: &Nvml, name: &str) -> String {
    match nvml.device_by_uuid(name) {
        Ok(device) => {
            let index = device.index().map_or("?".to_string(), |i| i.to_string());
            let model = device.name().unwrap_or_else(|_| "unknown GPU".into());
            format!("{index} ({model}, {name})")
        }
        Err(_) => name.to_string(),
    }
}

/// How far the device's fall may differ from the worker's own count and
/// still be "all of it back" (NVML's two counts round differently).
const RETURN_SLACK: u64 = 64 << 20;

/// What a worker gave back when it exited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuReturn {
    /// How far the device's used memory fell from its last sample while the worker ran.
    pub returned_bytes: u64,
    /// The device's used memory after the exit.
    pub used_after_bytes: u64,
}

/// The compute processes on a device: pid, and its memory where known.
pub type ProcessList = Vec<(u32, Option<u64>)>;

/// What a watch reads of a device: NVML's, or a stand-in in tests.
pub trait DeviceMemory: Send {
    /// The device's used memory.
    fn used(&self) -> Option<u64>;
    /// The compute processes on the device: pid, and its memory where known.
    fn processes(&self) -> Option<ProcessList>;
}

impl DeviceMemory for Device<'static> {
    fn used(&self) -> Option<u64> {
        self.memory_info().ok().map(|m| m.used)
    }

    fn processes(&self) -> Option<ProcessList> {
        let processes = self.running_compute_processes().ok()?;
        Some(
            processes
                .into_iter()
                .map(|p| match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => (p.pid, Some(bytes)),
                    UsedGpuMemory::Unavailable => (p.pid, None),
                })
                .collect(),
        )
    }
}

/// One sample while the worker lived.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// What the worker held (its own usage, or the device's growth when alone).
    held: u64,
    /// The device's used memory.
    device_used: u64,
}

/// Watches one worker's memory on one device.
pub struct GpuWatch {
    device: Box<dyn DeviceMemory>,
    pid: u32,
    /// The worker's slot is the only one on this device, so the device's
    /// growth since the worker started can stand in for the worker's own
    /// usage where NVML cannot see its pid (another pid namespace).
    alone: bool,
    /// The device's used memory when the watch began.
    baseline: Option<u64>,
    /// NVML has listed the worker's pid at least once.
    pid_seen: bool,
    peak: Option<u64>,
    last: Option<Sample>,
}

impl GpuWatch {
    /// Watches worker `pid` on `device` (a UUID, or an index), or `None`
    /// where NVML or the device is not there.
    pub fn start(nvml: Option<&'static Nvml>, device: &str, pid: u32, alone: bool) -> Option<GpuWatch> {
        let nvml = nvml?;
        let handle = match device.parse::<u32>() {
            Ok(index) => nvml.device_by_index(index),
            Err(_) => nvml.device_by_uuid(device),
        };
        let device = handle.map_err(|e| tracing::debug!("NVML cannot watch device {device}: {e}")).ok()?;
        Some(GpuWatch::on(Box::new(device), pid, alone))
    }

    /// Watches worker `pid` on `device`, from now.
    fn on(device: Box<dyn DeviceMemory>, pid: u32, alone: bool) -> GpuWatch {
        let baseline = device.used();
        GpuWatch { device, pid, alone, baseline, pid_seen: false, peak: None, last: None }
    }

    /// What the worker holds now, if NVML can tell.
    fn held_now(&mut self, device_used: Option<u64>) -> Option<u64> {
        let processes = self.device.processes()?;
        match processes.iter().find(|(pid, _)| *pid == self.pid) {
            Some((_, bytes)) => {
                self.pid_seen = true;
                *bytes
            }
            // Listed before, not now: the worker is leaving; its last
            // sample stands for what it held.
            None if self.pid_seen => None,
            None if self.alone => Some(device_used?.saturating_sub(self.baseline?)),
            None => None,
        }
    }

    /// Samples the worker's usage (called every tick while it runs).
    pub fn sample(&mut self) {
        let device_used = self.device.used();
        let Some(held) = self.held_now(device_used) else { return };
        self.peak = Some(self.peak.map_or(held, |p| p.max(held)));
        if let Some(device_used) = device_used {
            self.last = Some(Sample { held, device_used });
        }
    }

    /// The highest usage sampled since the last call (one unit's peak).
    pub fn take_peak(&mut self) -> Option<u64> {
        self.peak.take()
    }

    /// After the worker has exited: waits (up to 2 s) for the driver to
    /// let go of its memory, and says how much the device's used memory
    /// fell. `None` if nothing was sampled while it lived.
    pub fn after_exit(&self) -> Option<GpuReturn> {
        let last = self.last?;
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let used = self.device.used()?;
            let listed = self.device.processes().is_some_and(|ps| ps.iter().any(|(pid, _)| *pid == self.pid));
            // Alone on the device, everything it held must come back (give or
            // take the driver's rounding); shared, only its leaving can be awaited.
            let returned_bytes = last.device_used.saturating_sub(used);
            let all_back = returned_bytes.saturating_add(RETURN_SLACK) >= last.held;
            if (!listed && (!self.alone || all_back)) || Instant::now() >= deadline {
                if self.alone && !all_back {
                    tracing::warn!(
                        pid = self.pid,
                        held = last.held,
                        returned = returned_bytes,
                        "a worker exited, but its GPU has not got all of its memory back"
                    );
                }
                return Some(GpuReturn { returned_bytes, used_after_bytes: used });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices(names: &[&str]) -> GpuList {
        GpuList::Devices(names.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn gpus_parse_as_all_or_a_list() {
        assert_eq!(parse_gpus("all"), Ok(GpuList::All));
        assert_eq!(parse_gpus("ALL"), Ok(GpuList::All));
        assert_eq!(parse_gpus("0"), Ok(devices(&["0"])));
        assert_eq!(parse_gpus("0,1"), Ok(devices(&["0", "1"])));
        assert_eq!(parse_gpus(" 3, 1 ,02"), Ok(devices(&["3", "1", "2"])));
        let uuid = "GPU-5b1e0a8e-6c2a-4b5e-9d3e-0123456789ab";
        assert_eq!(parse_gpus(&format!("{uuid},1")), Ok(devices(&[uuid, "1"])));
        assert_eq!(
            parse_gpus("MIG-a1b2c3d4-0000-1111-2222-333344445555"),
            Ok(devices(&["MIG-a1b2c3d4-0000-1111-2222-333344445555"]))
        );
    }

    #[test]
    fn bad_gpu_lists_say_why() {
        for bad in ["", "0,", ",1", "-1", "1.5", "gpu0", "0,all", "GPU-", "12345", "0 1"] {
            let error = parse_gpus(bad).expect_err(bad);
            assert!(error.contains("is not a device"), "{bad}: {error}");
        }
        assert!(parse_gpus("0,1,0").unwrap_err().contains("device 0 is named twice"));
        assert!(parse_gpus("1,01").unwrap_err().contains("named twice"));
    }

    #[test]
    fn slots_spread_over_devices_round_robin() {
        let two: Vec<String> = vec!["0".into(), "1".into()];
        let assigned: Vec<&str> = (0..5).map(|slot| slot_device(&two, slot).unwrap()).collect();
        assert_eq!(assigned, ["0", "1", "0", "1", "0"]);
        assert_eq!(slot_device(&[], 0), None);
        let one: Vec<String> = vec!["GPU-x".into()];
        assert!((0..3).all(|slot| slot_device(&one, slot) == Some("GPU-x")));
        // Five slots on two devices: three on the first, two on the second.
        assert_eq!(slots_on_device(&two, 5, 0), 3);
        assert_eq!(slots_on_device(&two, 5, 3), 2);
        assert_eq!(slots_on_device(&two, 1, 0), 1);
        assert_eq!(slots_on_device(&[], 4, 0), 0);
    }

    #[test]
    fn without_nvml_devices_pass_through_and_all_is_an_error() {
        assert_eq!(resolve(&devices(&["0", "GPU-abc"]), None), Ok(vec!["0".to_string(), "GPU-abc".to_string()]));
        let error = resolve(&GpuList::All, None).unwrap_err();
        assert!(error.contains("NVML") && error.contains("--gpus 0,1"), "{error}");
    }

    /// A device whose memory and processes a test sets.
    #[derive(Clone, Default)]
    struct FakeDevice(std::sync::Arc<std::sync::Mutex<(u64, ProcessList)>>);

    impl FakeDevice {
        fn set(&self, used: u64, processes: &[(u32, Option<u64>)]) {
            *self.0.lock().unwrap() = (used, processes.to_vec());
        }
    }

    impl DeviceMemory for FakeDevice {
        fn used(&self) -> Option<u64> {
            Some(self.0.lock().unwrap().0)
        }
        fn processes(&self) -> Option<ProcessList> {
            Some(self.0.lock().unwrap().1.clone())
        }
    }

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn a_worker_peak_is_its_own_and_its_exit_gives_it_back() {
        let device = FakeDevice::default();
        let other = (7, Some(2 * GIB)); // another process on the device, all along
        device.set(2 * GIB + 500 * MIB, &[other]);
        let mut watch = GpuWatch::on(Box::new(device.clone()), 42, true);
        watch.sample(); // not on the device yet
        device.set(3 * GIB, &[other, (42, Some(500 * MIB))]);
        watch.sample();
        device.set(13 * GIB, &[other, (42, Some(10 * GIB + 500 * MIB))]);
        watch.sample();
        assert_eq!(watch.take_peak(), Some(10 * GIB + 500 * MIB));
        assert_eq!(watch.take_peak(), None, "one unit's peak at a time");
        device.set(2 * GIB + 500 * MIB, &[other]);
        let back = watch.after_exit().unwrap();
        assert_eq!(
            back,
            GpuReturn { returned_bytes: 13 * GIB - (2 * GIB + 500 * MIB), used_after_bytes: 2 * GIB + 500 * MIB }
        );
    }

    #[test]
    fn a_vanished_pid_does_not_stand_for_what_the_worker_held() {
        let device = FakeDevice::default();
        device.set(500 * MIB, &[]);
        let mut watch = GpuWatch::on(Box::new(device.clone()), 42, true);
        device.set(10 * GIB + 500 * MIB, &[(42, Some(10 * GIB))]);
        watch.sample();
        // Gone from NVML's list before isorun reaped it: the last sample stays.
        device.set(500 * MIB, &[]);
        watch.sample();
        assert_eq!(watch.take_peak(), Some(10 * GIB));
        assert_eq!(watch.after_exit().unwrap().returned_bytes, 10 * GIB);
    }

    #[test]
    fn unseen_pids_count_the_device_growth_only_for_a_slot_alone_on_it() {
        // NVML lists pids of another namespace: the worker's own never appears.
        let device = FakeDevice::default();
        device.set(GIB, &[(99_999, Some(4 * GIB))]);
        let mut alone = GpuWatch::on(Box::new(device.clone()), 42, true);
        let mut shared = GpuWatch::on(Box::new(device.clone()), 43, false);
        device.set(5 * GIB, &[(99_999, Some(4 * GIB))]);
        alone.sample();
        shared.sample();
        assert_eq!(alone.take_peak(), Some(4 * GIB));
        assert_eq!(shared.take_peak(), None, "a shared device's growth is not one worker's");
        assert_eq!(shared.after_exit(), None);
        device.set(GIB, &[]);
        assert_eq!(alone.after_exit(), Some(GpuReturn { returned_bytes: 4 * GIB, used_after_bytes: GIB }));
    }

    #[test]
    fn only_nvidia_n_device_files_are_gpus() {
        let dev = tempfile::tempdir().unwrap();
        assert!(!nvidia_device_files(dev.path()));
        for name in ["nvidiactl", "nvidia-uvm", "nvidia", "nvidia-caps"] {
            std::fs::write(dev.path().join(name), b"").unwrap();
        }
        assert!(!nvidia_device_files(dev.path()), "control devices are not GPUs");
        std::fs::write(dev.path().join("nvidia0"), b"").unwrap();
        assert!(nvidia_device_files(dev.path()));
        assert!(!nvidia_device_files(&dev.path().join("missing")));
    }

    #[test]
    fn a_missing_nvml_library_is_no_error() {
        assert!(load_nvml(OsStr::new("libnvidia-ml-that-does-not-exist.so.1")).is_none());
        assert!(GpuWatch::start(None, "0", 1, true).is_none());
    }
}
