//! Reading a full-model HDF5 file in the supervisor: whether an `.h5`
//! file is a model or weights, and its root group's `model_config` and
//! `keras_version` attributes.
//!
//! The `.h5` reader here is small and narrow on purpose. `hdf5`/`hdf5-metno`
//! link libhdf5; pure-Rust readers exist (`hdf5-reader`, `hdf5-pure`,
//! `rustyhdf5`) but are young, and each is a whole format parser to run on
//! untrusted files inside the supervisor, for one attribute (not tried
//! here; worth a look if more than the config is ever needed). What the
//! supervisor needs is little: the root group's `model_config` and
//! `keras_version` attributes, found as h5py finds them (from the
//! superblock to the root group's object header, its attribute messages by
//! name, a variable-length string's bytes in the global heap collection its
//! heap ID names, or a fixed-length string's inline), within the first
//! [`H5_SCAN_BYTES`]. Any other JSON in the file (another attribute, a
//! dataset) is not taken: what the supervisor reads is what Keras reads. A
//! file whose attributes it cannot find this way (stored densely, shared,
//! or past the bytes read) is still run (the export process reads it with
//! Keras); only `inspect` has less to say. Whether an `.h5` file is a
//! model at all is decided by the attribute name `model_config` in those
//! first bytes.

use super::architecture::architecture_digest;
use super::error::{KerasFileError, H5_SCAN_BYTES};
use super::model_config::{describe_config, KerasInfo};
use serde_json::Value;
use std::io::Read;
use std::path::Path;

/// The HDF5 file signature, at offset 0 of every file h5py writes.
const HDF5_SIGNATURE: &[u8] = b"\x89HDF\r\n\x1a\n";

/// True for an HDF5 file whose first bytes name a `model_config`
/// attribute: a model saved whole (`model.save("m.h5")`), not weights.
pub fn h5_is_full_model(path: &Path) -> Result<bool, KerasFileError> {
    let head = read_head(path)?;
    if !head.starts_with(HDF5_SIGNATURE) {
        return Err(KerasFileError::NotHdf5 { path: path.display().to_string() });
    }
    Ok(memchr_find(&head, b"model_config").is_some())
}

/// Reads the `model_config` (and Keras version) of a full-model `.h5` file:
/// its root group's attributes of those names, as h5py reads them.
pub fn read_h5(path: &Path) -> Result<KerasInfo, KerasFileError> {
    if !h5_is_full_model(path)? {
        return Err(KerasFileError::WeightsOnly { path: path.display().to_string() });
    }
    let head = read_head(path)?;
    let attribute = |name: &[u8]| attributes::root_string_attribute(&head, name);
    let text = attribute(b"model_config")
        .ok_or_else(|| KerasFileError::H5ConfigNotFound { path: path.display().to_string() })?;
    // Counted before it is parsed: its bytes were read from the file, so the
    // bound is the attribute's own length's.
    isorun_tensors::json_cost::check_json_cost(text).map_err(|reason| KerasFileError::BadJson {
        path: path.display().to_string(),
        member: "model_config",
        reason,
    })?;
    let config: Value = serde_json::from_slice(text).map_err(|e| KerasFileError::BadJson {
        path: path.display().to_string(),
        member: "model_config",
        reason: e.to_string(),
    })?;
    if !config.is_object() {
        return Err(KerasFileError::BadJson {
            path: path.display().to_string(),
            member: "model_config",
            reason: "expected a JSON object".into(),
        });
    }
    let mut info = describe_config(&config);
    info.keras_version =
        attribute(b"keras_version").and_then(|v| std::str::from_utf8(v).ok()).map(|v| v.trim().to_string());
    info.architecture = Some(architecture_digest("h5", &config, info.keras_version.as_deref()));
    Ok(info)
}

fn read_head(path: &Path) -> Result<Vec<u8>, KerasFileError> {
    let file =
        std::fs::File::open(path).map_err(|source| KerasFileError::Io { path: path.display().to_string(), source })?;
    let mut head = Vec::new();
    file.take(H5_SCAN_BYTES)
        .read_to_end(&mut head)
        .map_err(|source| KerasFileError::Io { path: path.display().to_string(), source })?;
    Ok(head)
}

fn memchr_find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The root group's attributes of an HDF5 file, read as h5py reads them
/// (HDF5 File Format Specification, version 3: superblock versions 0 to 3,
/// object header versions 1 and 2, attribute messages versions 1 to 3,
/// continuation blocks, scalar string attributes, fixed-length or
/// variable-length in a global heap collection). Every address is checked
/// against the bytes at hand; nothing is allocated from a size the file
/// states; a walk that cannot go on (dense attribute storage, a shared
/// message, an unknown version, an address past the bytes) finds nothing.
mod attributes {
    /// The most header messages and continuation blocks one walk visits.
    const MAX_MESSAGES: usize = 65_536;
    const MAX_BLOCKS: usize = 1_024;
    const ATTRIBUTE: u16 = 0x000c;
    const CONTINUATION: u16 = 0x0010;

    struct File<'a> {
        bytes: &'a [u8],
        offsets: usize,
        lengths: usize,
        base: u64,
    }

    impl<'a> File<'a> {
        fn uint(&self, at: usize, size: usize) -> Option<u64> {
            uint(self.bytes, at, size)
        }

        /// Where an address of the file points in `bytes` (addresses count from the base).
        fn at(&self, address: u64) -> Option<usize> {
            if address == u64::MAX >> (64 - 8 * self.offsets as u32) {
                return None; // the undefined address
            }
            usize::try_from(self.base.checked_add(address)?).ok().filter(|&at| at < self.bytes.len())
        }
    }

    fn uint(bytes: &[u8], at: usize, size: usize) -> Option<u64> {
        let field = bytes.get(at..at.checked_add(size)?)?;
        Some(field.iter().rev().fold(0u64, |n, &b| (n << 8) | u64::from(b)))
    }

    /// The superblock, and where the root group's object header starts.
    fn superblock(bytes: &[u8]) -> Option<(File<'_>, usize)> {
        if !bytes.starts_with(super::HDF5_SIGNATURE) {
            return None;
        }
        let sizes = |offsets: u8, lengths: u8| [2, 4, 8].contains(&offsets) && [2, 4, 8].contains(&lengths);
        let (offsets, lengths, base_at, root_at) = match *bytes.get(8)? {
            version @ (0 | 1) => {
                let (o, l) = (*bytes.get(13)?, *bytes.get(14)?);
                sizes(o, l).then_some(())?;
                let base_at = if version == 0 { 24 } else { 28 };
                // Base, free space, end of file, driver info, then the root's
                // symbol table entry: its link name offset, its object header.
                (o as usize, l as usize, base_at, base_at + 5 * o as usize)
            }
            2 | 3 => {
                let (o, l) = (*bytes.get(9)?, *bytes.get(10)?);
                sizes(o, l).then_some(())?;
                // Base, superblock extension, end of file, the root's object header.
                (o as usize, l as usize, 12, 12 + 3 * o as usize)
            }
            _ => return None,
        };
        let mut file = File { bytes, offsets, lengths, base: 0 };
        file.base = file.uint(base_at, offsets)?;
        let root = file.uint(root_at, offsets)?;
        let root = file.at(root)?;
        Some((file, root))
    }

    /// The data of every message of the object header at `at`, with its
    /// type, in order, continuation blocks followed (each once).
    fn messages<'a>(file: &File<'a>, at: usize) -> Option<Vec<(u16, &'a [u8])>> {
        let bytes = file.bytes;
        let mut found = Vec::new();
        let mut blocks: Vec<(usize, usize)> = Vec::new();
        let version2 = bytes.get(at..at + 4)? == b"OHDR";
        let mut creation_order = false;
        if version2 {
            (*bytes.get(at + 4)? == 2).then_some(())?;
            let flags = *bytes.get(at + 5)?;
            creation_order = flags & 0x04 != 0;
            let mut p = at + 6;
            if flags & 0x20 != 0 {
                p += 16;
            }
            if flags & 0x10 != 0 {
                p += 4;
            }
            let width = 1usize << (flags & 0x03);
            let size = usize::try_from(uint(bytes, p, width)?).ok()?;
            blocks.push((p + width, size));
        } else {
            (*bytes.get(at)? == 1).then_some(())?;
            let size = usize::try_from(uint(bytes, at + 8, 4)?).ok()?;
            blocks.push((at + 16, size));
        }
        let mut next = 0;
        while next < blocks.len() {
            let (start, size) = blocks[next];
            next += 1;
            let end = start.checked_add(size)?;
            (end <= bytes.len()).then_some(())?;
            let mut p = start;
            loop {
                let (kind, length, flags, data) = if version2 {
                    let head = 4 + if creation_order { 2 } else { 0 };
                    if p + head > end {
                        break; // a gap too small for a message
                    }
                    let length = uint(bytes, p + 1, 2)? as usize;
                    (u16::from(bytes[p]), length, bytes[p + 3], p + head)
                } else {
                    if p + 8 > end {
                        break;
                    }
                    (uint(bytes, p, 2)? as u16, uint(bytes, p + 2, 2)? as usize, bytes[p + 4], p + 8)
                };
                let stop = data.checked_add(length)?;
                (stop <= end).then_some(())?;
                // A shared message holds a reference to its data elsewhere: not followed.
                if flags & 0x02 == 0 {
                    found.push((kind, &bytes[data..stop]));
                }
                if kind == CONTINUATION {
                    let address = file.uint(data, file.offsets)?;
                    let size = usize::try_from(file.uint(data + file.offsets, file.lengths)?).ok()?;
                    let start = file.at(address)?;
                    let block = if version2 {
                        (bytes.get(start..start + 4)? == b"OCHK").then_some(())?;
                        // The signature first, the checksum last.
                        (start + 4, size.checked_sub(8)?)
                    } else {
                        (start, size)
                    };
                    if blocks.iter().all(|&(s, _)| s != block.0) {
                        blocks.push(block);
                    }
                    (blocks.len() <= MAX_BLOCKS).then_some(())?;
                }
                (found.len() <= MAX_MESSAGES).then_some(())?;
                p = if version2 { stop } else { data + length.div_ceil(8) * 8 };
            }
        }
        Some(found)
    }

    /// The value of the scalar string attribute `name` of the root group:
    /// its bytes, a fixed-length string's trailing NULs cut (as numpy does).
    pub(super) fn root_string_attribute<'a>(bytes: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
        let (file, root) = superblock(bytes)?;
        let messages = messages(&file, root)?;
        let mut named = messages.iter().filter(|(kind, _)| *kind == ATTRIBUTE).filter_map(|(_, data)| {
            let attribute = attribute(data)?;
            (attribute.name == name).then_some(attribute)
        });
        let found = named.next()?;
        if named.next().is_some() {
            return None; // two attributes of one name: not a file h5py wrote
        }
        scalar(found.dataspace)?;
        string(&file, found.datatype, found.value)
    }

    /// An attribute message's parts, each the bytes of its field.
    struct Attribute<'a> {
        /// Less its NUL.
        name: &'a [u8],
        datatype: &'a [u8],
        dataspace: &'a [u8],
        value: &'a [u8],
    }

    /// An attribute message's name, datatype, dataspace and data.
    fn attribute(data: &[u8]) -> Option<Attribute<'_>> {
        let version = *data.first()?;
        let flags = *data.get(1)?;
        let (name_size, type_size, space_size) =
            (uint(data, 2, 2)? as usize, uint(data, 4, 2)? as usize, uint(data, 6, 2)? as usize);
        let (pad, mut p): (fn(usize) -> usize, usize) = match version {
            1 => (|n| n.div_ceil(8) * 8, 8),
            2 => (|n| n, 8),
            3 => (|n| n, 9),
            _ => return None,
        };
        // A shared datatype or dataspace is a reference elsewhere: not followed.
        (version == 1 || flags & 0x03 == 0).then_some(())?;
        let name = data.get(p..p + name_size)?;
        let name = name.split(|&b| b == 0).next().unwrap_or(name);
        p += pad(name_size);
        let datatype = data.get(p..p + type_size)?;
        p += pad(type_size);
        let dataspace = data.get(p..p + space_size)?;
        p += pad(space_size);
        Some(Attribute { name, datatype, dataspace, value: data.get(p..)? })
    }

    /// A dataspace of one element, as h5py reads into a `str` (rank 0).
    fn scalar(dataspace: &[u8]) -> Option<()> {
        match (*dataspace.first()?, *dataspace.get(1)?) {
            (1, 0) => Some(()),
            (2, 0) if *dataspace.get(3)? == 0 => Some(()),
            _ => None,
        }
    }

    /// A string attribute's bytes: fixed-length (class 3) inline, or
    /// variable-length (class 9, type string) in a global heap collection.
    fn string<'a>(file: &File<'a>, datatype: &[u8], value: &'a [u8]) -> Option<&'a [u8]> {
        let class = *datatype.first()? & 0x0f;
        let size = usize::try_from(uint(datatype, 4, 4)?).ok()?;
        match class {
            3 => {
                let text = value.get(..size)?;
                let end = text.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
                Some(&text[..end])
            }
            9 if *datatype.get(1)? & 0x0f == 1 => {
                // The element: the string's length, then its global heap ID
                // (the collection's address and the object's index).
                let length = usize::try_from(uint(value, 0, 4)?).ok()?;
                let address = uint(value, 4, file.offsets)?;
                let index = uint(value, 4 + file.offsets, 4)?;
                let object = heap_object(file, file.at(address)?, index)?;
                object.get(..length)
            }
            _ => None,
        }
    }

    /// [`heap_object`] in `bytes` read as a file with 8-byte offsets and lengths.
    #[cfg(test)]
    pub(super) fn heap_object_in(bytes: &[u8], at: usize, index: u64) -> Option<&[u8]> {
        heap_object(&File { bytes, offsets: 8, lengths: 8, base: 0 }, at, index)
    }

    /// Object `index` of the global heap collection at `at` ("Global Heap":
    /// `GCOL`, version 1, 3 reserved bytes, the collection's size, then
    /// objects of a 2-byte index, a 2-byte reference count, 4 reserved
    /// bytes, a size and the data padded to 8; index 0 is free space).
    fn heap_object<'a>(file: &File<'a>, at: usize, index: u64) -> Option<&'a [u8]> {
        let bytes = file.bytes;
        (bytes.get(at..at + 4)? == b"GCOL" && *bytes.get(at + 4)? == 1).then_some(())?;
        let size = usize::try_from(file.uint(at + 8, file.lengths)?).ok()?;
        let end = at.checked_add(size)?.min(bytes.len());
        let mut object = at + 8 + file.lengths;
        while object + 8 + file.lengths <= end {
            let id = uint(bytes, object, 2)?;
            let length = usize::try_from(file.uint(object + 8, file.lengths)?).ok()?;
            if id == 0 {
                return None; // free space: the rest of the collection
            }
            let data = object + 8 + file.lengths;
            let stop = data.checked_add(length).filter(|&s| s <= end)?;
            if id == index {
                return Some(&bytes[data..stop]);
            }
            object = data + length.div_ceil(8) * 8;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keras::files::fixtures::{decoy_config, testdata};

    #[test]
    fn heap_objects_are_bounded_by_their_collection() {
        let mut bytes = b"xxxxGCOL\x01\0\0\0".to_vec();
        bytes.extend_from_slice(&(16u64 + 16 + 8 + 16).to_le_bytes());
        bytes.extend_from_slice(&[1, 0, 1, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&5u64.to_le_bytes());
        bytes.extend_from_slice(b"3.1.0\0\0\0");
        // A lying size runs past the collection: not found.
        bytes.extend_from_slice(&[2, 0, 1, 0, 0, 0, 0, 0]);
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(attributes::heap_object_in(&bytes, 4, 1), Some(&b"3.1.0"[..]));
        assert_eq!(attributes::heap_object_in(&bytes, 4, 2), None);
        assert_eq!(attributes::heap_object_in(&bytes, 4, 3), None);
        assert_eq!(attributes::heap_object_in(&bytes, 5, 1), None, "no collection there");
    }

    #[test]
    fn an_h5_model_config_is_the_root_attribute_h5py_reads_not_a_decoy_elsewhere() {
        // Each file holds another model config in a dataset written first
        // (first in the global heap), in another root attribute and in a
        // nested group's model_config; h5py's default layout and "latest",
        // variable- and fixed-length strings.
        for file in ["h5_decoys_v0.h5", "h5_decoys_latest.h5"] {
            let info = read_h5(&testdata(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(info.outputs, ["real_out"], "{file}");
            assert_eq!(info.keras_version.as_deref(), Some("3.15.1"), "{file}");
            let real = architecture_digest("h5", &decoy_config("real_out"), Some("3.15.1"));
            assert_eq!(info.architecture.as_deref(), Some(real.as_str()), "{file}");
        }
        // Files Keras 3 and tf_keras wrote.
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/keras");
        let keras3 = read_h5(&fixtures.join("ckpts/seq.h5")).unwrap();
        assert_eq!(
            (keras3.class_name.as_str(), keras3.outputs.as_slice()),
            ("Sequential", &["dense_1".to_string()][..])
        );
        assert!(keras3.keras_version.as_deref().is_some_and(|v| v.starts_with("3.")), "{keras3:?}");
        for file in ["keras2/k2_seq.h5", "keras2/k2_local.h5"] {
            let keras2 = read_h5(&fixtures.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert!(keras2.keras_version.as_deref().is_some_and(|v| v.starts_with("2.")), "{file}: {keras2:?}");
            assert!(!keras2.inputs.is_empty(), "{file}: {keras2:?}");
        }
    }

    #[test]
    fn an_h5_file_cut_or_changed_anywhere_finds_the_real_config_or_nothing() {
        let bytes = std::fs::read(testdata("h5_decoys_v0.h5")).unwrap();
        let real = attributes::root_string_attribute(&bytes, b"model_config").unwrap().to_vec();
        for cut in (0..bytes.len()).step_by(7) {
            let found = attributes::root_string_attribute(&bytes[..cut], b"model_config");
            assert!(found.is_none() || found == Some(&real[..]), "cut at {cut}");
        }
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut changed = bytes.clone();
            for _ in 0..4 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let at = (state % changed.len() as u64) as usize;
                changed[at] = (state >> 32) as u8;
            }
            // Any answer or none, never a panic.
            let _ = attributes::root_string_attribute(&changed, b"model_config");
        }
    }
}
