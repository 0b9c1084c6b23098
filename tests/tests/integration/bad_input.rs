//! Bad input gets a clear error and leaves nothing half done: broken
//! `.npy`/`.npz`/JSON files are usage errors naming the file (exit 2),
//! broken models are that model's `error` (the run goes on), and outputs are
//! never written through a link planted in the output folder, nor left half
//! written on a full disk. Complements usage.rs (argument and file errors
//! found before work starts) and fixtures.rs (a SavedModel that is not a
//! protocol buffer, a tag the model lacks).

use crate::util::{fake_models, fixtures, isorun, isorun_fault, run, write_input, Ran};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn keras_model() -> PathBuf {
    fixtures().join("models/keras_mlp")
}

fn keras_inputs() -> PathBuf {
    fixtures().join("expected/keras_mlp__serving_default/inputs.npz")
}

/// A usage error: exit 2, no records, one `isorun: error:` line naming every one of `names`.
fn assert_usage_error(ran: &Ran, names: &[&str]) {
    assert_eq!(ran.code, Some(2), "stdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    assert!(ran.records.is_empty(), "{}", ran.stdout);
    let line = ran.stderr.lines().find(|l| l.starts_with("isorun: error: "));
    let line = line.unwrap_or_else(|| panic!("no 'isorun: error: ' line in:\n{}", ran.stderr));
    for name in names {
        assert!(line.contains(name), "the error line should name {name:?}: {line}");
    }
}

/// `isorun run` of the Keras model with these extra arguments, in `dir`.
fn run_keras(dir: &Path, args: &[&str]) -> Ran {
    run(isorun().current_dir(dir).arg("run").arg(keras_model()).args(args))
}

use crate::util::npy_bytes;

pub(crate) fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xedb8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

/// A zip archive of stored (uncompressed) entries. `claimed_size`, when
/// given, is written as every entry's uncompressed size instead of the truth.
pub(crate) fn zip_stored(entries: &[(&str, &[u8])], claimed_size: Option<u32>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data) in entries {
        let offset = out.len() as u32;
        let (crc, size) = (crc32(data), data.len() as u32);
        let mut fields = Vec::new();
        fields.extend_from_slice(&[20, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // version, flags, stored, time, date
        fields.extend_from_slice(&crc.to_le_bytes());
        fields.extend_from_slice(&size.to_le_bytes());
        fields.extend_from_slice(&claimed_size.unwrap_or(size).to_le_bytes());
        fields.extend_from_slice(&(name.len() as u16).to_le_bytes());
        fields.extend_from_slice(&[0, 0]); // extra field length
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&fields);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&[20, 0]); // made by
        central.extend_from_slice(&fields);
        central.extend_from_slice(&[0; 10]); // comment length, disk, internal and external attributes
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let central_offset = out.len() as u32;
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    out.extend_from_slice(&(central.len() as u32).to_le_bytes());
    out.extend_from_slice(&central_offset.to_le_bytes());
    out.extend_from_slice(&[0, 0]);
    out
}

// ---------------------------------------------------------------------------
// Input files

#[test]
fn an_npy_cut_inside_its_header_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = std::fs::read(write_input(tmp.path())).unwrap();
    std::fs::write(tmp.path().join("cut.npy"), &whole[..30]).unwrap();
    let ran = run_keras(tmp.path(), &["--input", "features=cut.npy"]);
    assert_usage_error(&ran, &["cut.npy", "header claims 118 bytes but the file is 30 bytes long"]);
    std::fs::write(tmp.path().join("tiny.npy"), &whole[..7]).unwrap();
    let ran = run_keras(tmp.path(), &["--input", "features=tiny.npy"]);
    assert_usage_error(&ran, &["tiny.npy", "too short"]);
}

#[test]
fn huge_claimed_shapes_are_refused_before_anything_is_allocated() {
    let tmp = tempfile::tempdir().unwrap();
    let overflow =
        npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }", &[]);
    std::fs::write(tmp.path().join("overflow.npy"), overflow).unwrap();
    let ran = run_keras(tmp.path(), &["--input", "features=overflow.npy"]);
    assert_usage_error(&ran, &["overflow.npy", "[1099511627776, 1099511627776]", "too many elements"]);
    let terabyte = npy_bytes("{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776, 8), }", &[0; 64]);
    std::fs::write(tmp.path().join("terabyte.npy"), terabyte).unwrap();
    let ran = run_keras(tmp.path(), &["--input", "features=terabyte.npy"]);
    assert_usage_error(&ran, &["terabyte.npy", "70368744177664 bytes", "holds 64 bytes"]);
    let zero_width = npy_bytes("{'descr': '|S0', 'fortran_order': False, 'shape': (4611686018427387904,), }", &[]);
    std::fs::write(tmp.path().join("zero.npy"), zero_width).unwrap();
    let ran = run_keras(tmp.path(), &["--input", "features=zero.npy"]);
    assert_usage_error(&ran, &["zero.npy", "zero-width dtype '|S0'"]);
}

#[test]
fn a_truncated_npz_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = std::fs::read(keras_inputs()).unwrap();
    std::fs::write(tmp.path().join("half.npz"), &whole[..whole.len() / 2]).unwrap();
    let ran = run_keras(tmp.path(), &["--inputs", "half.npz"]);
    assert_usage_error(&ran, &["half.npz", "not a valid .npz"]);
}

#[test]
fn corrupt_npz_entries_are_named_with_the_entry() {
    let tmp = tempfile::tempdir().unwrap();
    let not_npy = zip_stored(&[("features.npy", b"PK\x03\x04 this is no array")], None);
    std::fs::write(tmp.path().join("magic.npz"), not_npy).unwrap();
    let ran = run_keras(tmp.path(), &["--inputs", "magic.npz"]);
    assert_usage_error(&ran, &["magic.npz/features.npy", "wrong magic number"]);
    let short = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 8), }", &[0; 12]);
    let truncated = zip_stored(&[("features.npy", &short)], None);
    std::fs::write(tmp.path().join("short.npz"), truncated).unwrap();
    let ran = run_keras(tmp.path(), &["--inputs", "short.npz"]);
    assert_usage_error(&ran, &["short.npz/features.npy", "96 bytes", "holds 12 bytes"]);
    let other = zip_stored(&[("readme.txt", b"hello")], None);
    std::fs::write(tmp.path().join("other.npz"), other).unwrap();
    let ran = run_keras(tmp.path(), &["--inputs", "other.npz"]);
    assert_usage_error(&ran, &["other.npz", "entry 'readme.txt' is not an .npy array"]);
}

#[test]
fn an_npz_entry_lying_about_its_size_is_refused_without_reserving_it() {
    // The entry says it holds 4 GiB; it holds 128 bytes, whose header claims
    // a billion floats. Reading must not reserve what is claimed: under a
    // 1 GiB address-space limit, that would abort isorun.
    let tmp = tempfile::tempdir().unwrap();
    let npy = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000,), }", &[]);
    let lying = zip_stored(&[("features.npy", &npy)], Some(0xffff_fff0));
    std::fs::write(tmp.path().join("lying.npz"), lying).unwrap();
    let mut command = isorun();
    command.current_dir(tmp.path()).arg("run").arg(keras_model()).args(["--inputs", "lying.npz"]);
    limit_address_space(&mut command, 1 << 30);
    let ran = run(&mut command);
    assert_usage_error(&ran, &["lying.npz/features.npy"]);
}

/// Limits the address space of the command (and of anything it starts).
fn limit_address_space(command: &mut Command, bytes: u64) {
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[test]
fn truncated_or_misshapen_json_files_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("cut.json"), br#"{"features": [[1, 2"#).unwrap();
    let ran = run_keras(tmp.path(), &["--inputs", "cut.json"]);
    assert_usage_error(&ran, &["cut.json", "not valid JSON"]);
    std::fs::write(tmp.path().join("number.json"), b"42").unwrap();
    let ran = run_keras(tmp.path(), &["--inputs", "number.json"]);
    assert_usage_error(&ran, &["number.json", "expected an object"]);
    std::fs::write(tmp.path().join("binary.json"), b"\xff\xfe{\x00").unwrap();
    let ran = run_keras(tmp.path(), &["--input", "features=binary.json"]);
    assert_usage_error(&ran, &["binary.json"]);
}

#[test]
fn nan_or_infinity_into_an_integer_input_is_the_models_error_naming_the_input() {
    let model = fixtures().join("models/multi_sig");
    for (value, shown) in [(r#""NaN""#, r#""NaN""#), (r#""-Infinity""#, r#""-Infinity""#), ("1e300", "1e+300")] {
        let ran = run(isorun()
            .arg("run")
            .arg(&model)
            .args(["--signature", "add", "--input"])
            .arg(format!("a=@[1, {value}, 3]")));
        assert_eq!(ran.code, Some(1), "{}", ran.stderr);
        let record = &ran.records[0];
        assert_eq!(record["status"], "error", "{record}");
        assert_eq!(record["error"]["kind"], "input_mismatch", "{record}");
        assert_eq!(
            record["error"]["message"],
            format!("input 'a': element 1 is {shown}, which is not exactly a int64"),
            "{record}"
        );
    }
}

// ---------------------------------------------------------------------------
// Models (the real worker)

fn copy_dir(from: &Path, to: &Path, skip: &str) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() == skip {
            continue;
        }
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target, skip);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[test]
fn empty_or_truncated_saved_models_and_missing_variables_fail_to_load_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let models = tmp.path().join("models");
    let pb = std::fs::read(keras_model().join("saved_model.pb")).unwrap();
    copy_dir(&keras_model(), &models.join("a-empty"), "");
    std::fs::write(models.join("a-empty/saved_model.pb"), b"").unwrap();
    copy_dir(&keras_model(), &models.join("b-truncated"), "");
    std::fs::write(models.join("b-truncated/saved_model.pb"), &pb[..pb.len() / 2]).unwrap();
    copy_dir(&keras_model(), &models.join("c-no-variables"), "variables");
    copy_dir(&keras_model(), &models.join("d-intact"), "");
    let ran = run(isorun().arg("run").arg(&models).arg("--inputs").arg(keras_inputs()).args(["-j", "2", "--json"]));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    assert_eq!(ran.record("d-intact")["status"], "ok", "{}", ran.stdout);
    for id in ["a-empty", "b-truncated"] {
        let record = ran.record(id);
        assert_eq!(record["status"], "error", "{record}");
        assert_eq!(record["error"]["kind"], "load_failed", "{record}");
    }
    // TensorFlow's loader skips restoring when `variables/` is missing; the
    // worker checks for it, so the model fails to load, naming the file.
    let missing = ran.record("c-no-variables");
    assert_eq!(missing["status"], "error", "{missing}");
    assert_eq!(missing["error"]["kind"], "load_failed", "{missing}");
    assert!(missing["error"]["message"].as_str().unwrap().contains("variables/variables.index: missing"), "{missing}");
}

// ---------------------------------------------------------------------------
// Permissions

/// Runs the command as `nobody` when the tests run as root (root reads
/// anything, so a permission test would prove nothing), after opening
/// `tmp` to others. `None`, with a loud note, when that is not possible.
fn as_unprivileged(command: &mut Command, tmp: &Path, test: &str) -> Option<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some(());
    }
    let exe = crate::util::bin("isorun");
    let others_can_run = exe
        .ancestors()
        .skip(1)
        .all(|dir| std::fs::metadata(dir).map(|m| m.permissions().mode() & 0o001 != 0).unwrap_or(false));
    if !others_can_run {
        eprintln!("NOTE: {test} SKIPPED: running as root, and user nobody cannot reach {}", exe.display());
        return None;
    }
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
    command.uid(65534).gid(65534);
    Some(())
}

#[test]
fn unreadable_inputs_and_model_files_are_named() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    // An unreadable input file: a usage error naming it.
    let input = write_input(root);
    std::fs::copy(&input, root.join("locked.npy")).unwrap();
    std::fs::set_permissions(root.join("locked.npy"), std::fs::Permissions::from_mode(0o000)).unwrap();
    fake_models(&root.join("models"), &["good"]);
    let mut command = isorun_fault(&[]);
    command.arg(root.join("models")).arg(format!("--input=x={}", root.join("locked.npy").display()));
    if as_unprivileged(&mut command, root, "unreadable_inputs_and_model_files_are_named").is_none() {
        return;
    }
    let ran = run(&mut command);
    assert_usage_error(&ran, &["locked.npy", "cannot read"]);

    // An unreadable saved_model.pb, read by the supervisor for a JSON
    // input's dtypes: that model's load_failed, naming the file.
    let models = root.join("models");
    std::fs::create_dir_all(models.join("locked")).unwrap();
    std::fs::copy(fixtures().join("models/multi_sig/saved_model.pb"), models.join("locked/saved_model.pb")).unwrap();
    std::fs::set_permissions(models.join("locked/saved_model.pb"), std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::copy(fixtures().join("models/multi_sig/saved_model.pb"), models.join("good/saved_model.pb")).unwrap();
    // An unreadable folder below the models: skipped with a warning naming it.
    std::fs::create_dir_all(models.join("sealed/inner")).unwrap();
    std::fs::write(models.join("sealed/inner/saved_model.pb"), b"").unwrap();
    std::fs::set_permissions(models.join("sealed"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let mut command = isorun_fault(&[]);
    command.arg(&models).args(["--input", "x=@[[1, 2, 3]]", "--json"]);
    as_unprivileged(&mut command, root, "unreadable_inputs_and_model_files_are_named").unwrap();
    let ran = run(&mut command);
    // The unreadable folder given itself: a usage error naming it, not "no SavedModel found".
    let mut command = isorun_fault(&[]);
    command.arg(models.join("sealed")).args(["--input", "x=@[[1, 2, 3]]"]);
    as_unprivileged(&mut command, root, "unreadable_inputs_and_model_files_are_named").unwrap();
    let sealed = run(&mut command);
    std::fs::set_permissions(models.join("sealed"), std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_usage_error(&sealed, &[models.join("sealed").to_str().unwrap(), "cannot read", "Permission denied"]);
    assert_eq!(ran.code, Some(1), "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(ran.statuses(), [("good".to_string(), "ok".to_string()), ("locked".into(), "error".into())]);
    let locked = ran.record("locked");
    assert_eq!(locked["error"]["kind"], "load_failed", "{locked}");
    let message = locked["error"]["message"].as_str().unwrap();
    assert!(message.contains("locked/saved_model.pb") && message.contains("cannot read"), "{locked}");
    let warning = ran.stderr.lines().find(|l| l.contains("sealed")).unwrap_or_else(|| panic!("{}", ran.stderr));
    assert!(warning.starts_with("isorun: warning: ") && warning.contains("cannot read the folder"), "{warning}");
}

// ---------------------------------------------------------------------------
// Outputs

fn run_with_output_dir(root: &Path, models: &[&str], out: &Path) -> Ran {
    fake_models(&root.join("models"), models);
    let input = write_input(root);
    run(isorun_fault(&[])
        .arg(root.join("models"))
        .arg(format!("--input=x={}", input.display()))
        .arg("--output-dir")
        .arg(out)
        .arg("--json"))
}

#[test]
fn a_linked_model_folder_in_the_output_dir_is_not_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, elsewhere) = (tmp.path().join("out"), tmp.path().join("elsewhere"));
    std::fs::create_dir_all(&out).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, out.join("a")).unwrap();
    let ran = run_with_output_dir(tmp.path(), &["a", "b"], &out);
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let a = ran.record("a");
    assert_eq!((a["status"].as_str(), a["error"]["kind"].as_str()), (Some("error"), Some("output_write")), "{a}");
    assert_eq!(
        a["error"]["message"],
        format!("{}: is a symbolic link; isorun does not write outputs through links", out.join("a").display())
    );
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing was written through the link");
    assert_eq!(ran.record("b")["status"], "ok");
    assert!(out.join("b/x.npy").is_file());
}

#[test]
fn a_linked_output_file_is_replaced_not_written_through() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let victim = tmp.path().join("victim.txt");
    std::fs::write(&victim, b"precious").unwrap();
    std::fs::create_dir_all(out.join("m")).unwrap();
    std::os::unix::fs::symlink(&victim, out.join("m/x.npy")).unwrap();
    let ran = run_with_output_dir(tmp.path(), &["m"], &out);
    assert_eq!(ran.code, Some(0), "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    let written = std::fs::symlink_metadata(out.join("m/x.npy")).unwrap();
    assert!(written.is_file(), "the link was replaced by the output");
    assert_eq!(std::fs::read(out.join("m/x.npy")).unwrap(), std::fs::read(tmp.path().join("x.npy")).unwrap());
}

/// A 64 KiB tmpfs, unmounted when dropped.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path) -> Option<SmallDisk> {
        std::fs::create_dir_all(dir).unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
            .arg(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        mounted.then(|| SmallDisk(dir.to_path_buf()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_is_reported_as_such_and_leaves_no_partial_file() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let Some(_disk) = SmallDisk::mount(&out) else {
        eprintln!(
            "NOTE: a_full_disk_is_reported_as_such_and_leaves_no_partial_file SKIPPED: cannot mount a tmpfs here"
        );
        return;
    };
    // 100,000 float32 (400 KB) echoed back by the fault worker: no room.
    let big = npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (100000,), }", &vec![0; 400_000]);
    std::fs::write(tmp.path().join("big.npy"), big).unwrap();
    fake_models(&tmp.path().join("models"), &["big"]);
    let ran = run(isorun_fault(&[])
        .arg(tmp.path().join("models"))
        .arg(format!("--input=x={}", tmp.path().join("big.npy").display()))
        .arg("--output-dir")
        .arg(&out)
        .arg("--json"));
    assert_eq!(ran.code, Some(1), "{}", ran.stderr);
    let big = ran.record("big");
    assert_eq!((big["status"].as_str(), big["error"]["kind"].as_str()), (Some("error"), Some("output_write")), "{big}");
    let message = big["error"]["message"].as_str().unwrap();
    assert!(message.contains("big/x.npy") && message.contains("No space left on device"), "{message}");
    let left: Vec<_> = std::fs::read_dir(out.join("big")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "no partial or temporary file is left: {left:?}");
}
