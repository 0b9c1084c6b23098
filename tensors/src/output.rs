//! Writing outputs as `DIR/<model id>/<output name>.npy`: each file is
//! written under a temporary name in the same folder and renamed into place,
//! so a reader never sees half a file. [`StreamedOutputs`] writes an
//! evaluation's outputs batch by batch the same way.
//!
//! Nothing is written through a symbolic link found below `DIR`: a link
//! planted as `DIR/<model id>` (or any folder of a nested id) would send a
//! model's outputs anywhere the user can write, so it is refused, naming the
//! path. A link planted as an output file is harmless: the rename replaces
//! the link itself, and the temporary file is created anew, never opened
//! through a link. `DIR` itself is the user's choice and may be a link.

use crate::npy::{header_v1, npy_body, write_npy};
use isorun_protocol::{Tensor, TensorData};
use std::fs::File;
use std::io::{self, Seek, Write};
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

/// `DIR/<model id>.<extension>` for a file per model (`isorun eval
/// --predictions`): an id with `/` nests folders below `DIR` as
/// [`write_outputs`] does (created one by one, links and `..` refused).
pub fn model_file(dir: &Path, model_id: &str, extension: &str) -> io::Result<PathBuf> {
    let (parent, name) = match model_id.rsplit_once('/') {
        Some((parent, name)) => (Some(parent), name),
        None => (None, model_id),
    };
    if name.is_empty() || name == "." || name == ".." {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: model id '{model_id}' is not a relative path of plain names", dir.display()),
        ));
    }
    let folder = match parent {
        Some(parent) => model_folder(dir, parent)?,
        None => {
            std::fs::create_dir_all(dir).map_err(|e| annotate(e, dir))?;
            dir.to_path_buf()
        }
    };
    Ok(folder.join(format!("{name}.{extension}")))
}

fn annotate(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Outputs written batch by batch (`isorun eval --output-dir`), so that
/// nothing is kept in memory: each output's rows go to a temporary `.npy`
/// in `DIR/<model id>/` whose header, written first with room for any row
/// count, is rewritten with the final count by [`StreamedOutputs::finish`],
/// which then renames every file into place. Dropped unfinished (a unit
/// that failed part-way), it removes its temporary files: a failed unit
/// leaves no output, as with `run`.
pub struct StreamedOutputs {
    folder: PathBuf,
    files: Vec<Appended>,
    finished: bool,
}

struct Appended {
    name: String,
    temporary: PathBuf,
    file: io::BufWriter<File>,
    descr: String,
    /// Every dimension but the first.
    row_shape: Vec<u64>,
    rows: u64,
    header_len: usize,
}

/// Room for a first dimension of any `u64`.
const ROWS_ROOM: u64 = u64::MAX;

impl StreamedOutputs {
    /// Outputs of `model_id` under `dir` (created as [`write_outputs`] does).
    pub fn create(dir: &Path, model_id: &str) -> io::Result<StreamedOutputs> {
        Ok(StreamedOutputs { folder: model_folder(dir, model_id)?, files: Vec::new(), finished: false })
    }

    /// Appends one batch's outputs: the same names, dtypes and row shapes
    /// every batch; strings (whose fixed width the first batch cannot know)
    /// and scalars (which have no rows) are refused, naming the output.
    pub fn append(&mut self, outputs: &[(String, Tensor)]) -> io::Result<()> {
        let invalid = |message: String| io::Error::new(io::ErrorKind::InvalidData, message);
        if !self.files.is_empty() && self.files.len() != outputs.len() {
            return Err(invalid(format!("a batch has {} outputs, the first had {}", outputs.len(), self.files.len())));
        }
        for (index, (name, tensor)) in outputs.iter().enumerate() {
            let target = self.folder.join(format!("{name}.npy"));
            if matches!(tensor.data, TensorData::Strings(_)) {
                return Err(annotate(
                    invalid(format!("output {name} holds strings, which cannot be written batch by batch")),
                    &target,
                ));
            }
            let Some((&rows, row_shape)) = tensor.shape.split_first() else {
                return Err(annotate(
                    invalid(format!("output {name} is a scalar: it has no rows to write batch by batch")),
                    &target,
                ));
            };
            let (descr, data) = npy_body(tensor).map_err(|e| annotate(e, &target))?;
            if index == self.files.len() {
                let mut reserved = vec![ROWS_ROOM];
                reserved.extend_from_slice(row_shape);
                let header = header_v1(&descr, &reserved, 0).ok_or_else(|| {
                    annotate(invalid(format!("output {name}: shape too long for a .npy header")), &target)
                })?;
                let temporary = self.folder.join(format!(".{name}.npy.tmp-{}", std::process::id()));
                match std::fs::remove_file(&temporary) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(annotate(e, &temporary)),
                    _ => {}
                }
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&temporary)
                    .map_err(|e| annotate(e, &temporary))?;
                let mut file = io::BufWriter::new(file);
                file.write_all(&header).map_err(|e| annotate(e, &temporary))?;
                self.files.push(Appended {
                    name: name.clone(),
                    temporary,
                    file,
                    descr: descr.clone(),
                    row_shape: row_shape.to_vec(),
                    rows: 0,
                    header_len: header.len(),
                });
            }
            let appended = &mut self.files[index];
            if appended.name != *name || appended.descr != descr || appended.row_shape != row_shape {
                return Err(annotate(
                    invalid(format!(
                        "output {name} ({descr}, rows of {:?}) differs from the first batch's {} ({}, rows of {:?})",
                        row_shape, appended.name, appended.descr, appended.row_shape
                    )),
                    &target,
                ));
            }
            appended.file.write_all(&data).map_err(|e| annotate(e, &appended.temporary))?;
            appended.rows += rows;
        }
        Ok(())
    }

    /// Fixes each header's row count, syncs, and renames every file into place.
    pub fn finish(mut self) -> io::Result<()> {
        self.finished = true;
        for appended in &mut self.files {
            let mut shape = vec![appended.rows];
            shape.extend_from_slice(&appended.row_shape);
            let header = header_v1(&appended.descr, &shape, appended.header_len).expect("fits: room was reserved");
            debug_assert_eq!(header.len(), appended.header_len);
            let result = (|| {
                appended.file.flush()?;
                let file = appended.file.get_mut();
                file.seek(io::SeekFrom::Start(0))?;
                file.write_all(&header)?;
                file.sync_all()?;
                std::fs::rename(&appended.temporary, self.folder.join(format!("{}.npy", appended.name)))
            })();
            result.map_err(|e| annotate(e, &appended.temporary))?;
        }
        Ok(())
    }
}

impl Drop for StreamedOutputs {
    fn drop(&mut self) {
        if !self.finished {
            for appended in &self.files {
                let _ = std::fs::remove_file(&appended.temporary);
            }
        }
    }
}

#[cfg(test)]
mod streamed_tests {
    use super::*;
    use crate::npy::read_npy_file;
    use isorun_protocol::DType;

    fn rows(values: &[f32]) -> Tensor {
        Tensor::dense(
            DType::Float32,
            vec![values.len() as u64 / 2, 2],
            values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        )
    }

    #[test]
    fn batches_become_one_npy_with_every_row() {
        let dir = tempfile::tempdir().unwrap();
        let mut streamed = StreamedOutputs::create(dir.path(), "m").unwrap();
        streamed.append(&[("y".into(), rows(&[1.0, 2.0, 3.0, 4.0]))]).unwrap();
        streamed.append(&[("y".into(), rows(&[5.0, 6.0]))]).unwrap();
        assert!(!dir.path().join("m/y.npy").exists(), "nothing in place before the end");
        streamed.finish().unwrap();
        let tensor = read_npy_file(&dir.path().join("m/y.npy")).unwrap();
        assert_eq!(tensor.shape, [3, 2]);
        assert_eq!(tensor, rows(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        assert_eq!(std::fs::read_dir(dir.path().join("m")).unwrap().count(), 1, "no temporary left");
    }

    #[test]
    fn an_unfinished_or_inconsistent_stream_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut streamed = StreamedOutputs::create(dir.path(), "m").unwrap();
        streamed.append(&[("y".into(), rows(&[1.0, 2.0]))]).unwrap();
        let other = Tensor::dense(DType::Float32, vec![1, 3], vec![0; 12]);
        let error = streamed.append(&[("y".into(), other)]).unwrap_err().to_string();
        assert!(error.contains("differs from the first batch"), "{error}");
        drop(streamed);
        assert_eq!(std::fs::read_dir(dir.path().join("m")).unwrap().count(), 0);
        let mut streamed = StreamedOutputs::create(dir.path(), "m").unwrap();
        let error = streamed.append(&[("s".into(), Tensor::strings(vec![1], vec![b"a".to_vec()]))]).unwrap_err();
        assert!(error.to_string().contains("holds strings"), "{error}");
    }
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
