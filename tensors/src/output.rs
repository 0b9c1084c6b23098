//! Writing outputs as `DIR/<model id>/<output name>.npy`: each file is
//! written under a temporary name in the same folder and renamed into place,
//! so a reader never sees half a file.
//!
//! Nothing is written through a symbolic link found below `DIR`: a link
//! planted as `DIR/<model id>` (or any folder of a nested id) would send a
//! model's outputs anywhere the user can write, so it is refused, naming the
//! path. A link planted as an output file is harmless: the rename replaces
//! the link itself, and the temporary file is created anew, never opened
//! through a link. `DIR` itself is the user's choice and may be a link.

use crate::npy::write_npy;
use isorun_protocol::Tensor;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes every output of one model.
pub fn write_outputs(dir: &Path, model_id: &str, outputs: &[(String, Tensor)]) -> io::Result<()> {
    let folder = model_folder(dir, model_id)?;
    for (name, tensor) in outputs {
        crate::npy::check_writable(tensor).map_err(|e| annotate(e, &folder.join(format!("{name}.npy"))))?;
    }
    for (name, tensor) in outputs {
        let target = folder.join(format!("{name}.npy"));
        let temporary = folder.join(format!(".{name}.npy.tmp-{}", std::process::id()));
        let result = (|| {
            // A stale temporary (or a link planted under its name) goes
            // first; `create_new` then refuses anything that reappears.
            match std::fs::remove_file(&temporary) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&temporary)?;
            let mut file = io::BufWriter::new(file);
            write_npy(&mut file, tensor)?;
            file.flush()?;
            file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(&temporary, &target)
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&temporary);
            return Err(annotate(e, &target));
        }
    }
    Ok(())
}

/// `DIR/<model id>`, created folder by folder below `DIR`, refusing any
/// part of it that is a symbolic link or not a folder.
fn model_folder(dir: &Path, model_id: &str) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| annotate(e, dir))?;
    let mut folder = dir.to_path_buf();
    for part in Path::new(model_id).components() {
        let std::path::Component::Normal(part) = part else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: model id '{model_id}' is not a relative path of plain names", dir.display()),
            ));
        };
        folder.push(part);
        if let Err(e) = std::fs::create_dir(&folder) {
            if e.kind() != io::ErrorKind::AlreadyExists {
                return Err(annotate(e, &folder));
            }
        }
        let meta = std::fs::symlink_metadata(&folder).map_err(|e| annotate(e, &folder))?;
        if meta.file_type().is_symlink() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: is a symbolic link; isorun does not write outputs through links", folder.display()),
            ));
        }
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: exists and is not a folder", folder.display()),
            ));
        }
    }
    Ok(folder)
}

fn annotate(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use isorun_protocol::DType;

    fn outputs() -> Vec<(String, Tensor)> {
        vec![("y".into(), Tensor::dense(DType::Int32, vec![2], vec![1, 0, 0, 0, 2, 0, 0, 0]))]
    }

    #[test]
    fn nested_ids_are_created_and_files_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        write_outputs(&out, "serving/m/2", &outputs()).unwrap();
        write_outputs(&out, "serving/m/2", &outputs()).unwrap();
        let names: Vec<_> =
            std::fs::read_dir(out.join("serving/m/2")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["y.npy"], "no temporary file is left");
    }

    #[test]
    fn a_linked_model_folder_is_refused_and_nothing_is_written_through_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (out, elsewhere) = (tmp.path().join("out"), tmp.path().join("elsewhere"));
        std::fs::create_dir_all(out.join("serving")).unwrap();
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, out.join("m")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, out.join("serving/m")).unwrap();
        for (id, link) in [("m", "m"), ("serving/m/2", "serving/m")] {
            let err = write_outputs(&out, id, &outputs()).unwrap_err().to_string();
            assert_eq!(
                err,
                format!(
                    "{}: is a symbolic link; isorun does not write outputs through links",
                    out.join(link).display()
                )
            );
        }
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[test]
    fn a_linked_output_file_or_temporary_is_replaced_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        std::fs::create_dir_all(out.join("m")).unwrap();
        std::os::unix::fs::symlink(&victim, out.join("m/y.npy")).unwrap();
        std::os::unix::fs::symlink(&victim, out.join(format!("m/.y.npy.tmp-{}", std::process::id()))).unwrap();
        write_outputs(&out, "m", &outputs()).unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert!(!std::fs::symlink_metadata(out.join("m/y.npy")).unwrap().file_type().is_symlink());
    }

    #[test]
    fn a_full_disk_is_reported_as_such() {
        let mut full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
        let err = write_npy(&mut full, &outputs()[0].1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        let err = annotate(err, Path::new("/out/m/y.npy"));
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        assert!(err.to_string().starts_with("/out/m/y.npy: No space left on device"), "{err}");
    }
}
