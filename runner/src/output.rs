//! Writing outputs as `DIR/<model id>/<output name>.npy`: each file is
//! written under a temporary name in the same folder and renamed into place,
//! so a reader never sees half a file.

use crate::npy::write_npy;
use isorun_protocol::Tensor;
use std::io::{self, Write};
use std::path::Path;

/// Writes every output of one model.
pub fn write_outputs(dir: &Path, model_id: &str, outputs: &[(String, Tensor)]) -> io::Result<()> {
    let folder = dir.join(model_id);
    std::fs::create_dir_all(&folder).map_err(|e| annotate(e, &folder))?;
    for (name, tensor) in outputs {
        let target = folder.join(format!("{name}.npy"));
        let temporary = folder.join(format!(".{name}.npy.tmp-{}", std::process::id()));
        let result = (|| {
            let mut file = io::BufWriter::new(std::fs::File::create(&temporary)?);
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

fn annotate(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}
