//! Large input tensors, written once by the supervisor and mapped by every
//! worker: a sealed `memfd`. Sealing (no write, grow or shrink, no new
//! seal) makes the region immutable for everyone holding it, so a worker
//! can neither change the inputs another worker reads nor make a reader
//! fault by truncating the file behind its mapping. It travels as a file
//! descriptor (`SCM_RIGHTS`) on the worker's socket (`request.rs`).

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// A read-only shared region; clones share one mapping.
#[derive(Clone)]
pub struct SharedMemory {
    mapping: Arc<Mapping>,
}

struct Mapping {
    fd: OwnedFd,
    /// What mmap returned, and its length (page-aligned start).
    base: *const u8,
    map_len: usize,
    /// The region: `len` bytes at `address`, which is `offset` bytes into the file.
    address: *const u8,
    len: usize,
    offset: u64,
}

// SAFETY: the mapping is read-only for its whole life and sealed against
// writes, so sharing its address between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.map_len > 0 {
            // SAFETY: base and map_len are those mmap returned; nothing borrows them any more.
            unsafe { libc::munmap(self.base as *mut libc::c_void, self.map_len) };
        }
    }
}

/// Seals that make a memfd immutable (`memfd_create(2)`).
const SEALS: libc::c_int = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;

impl SharedMemory {
    /// A new sealed region holding `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> io::Result<SharedMemory> {
        // SAFETY: a constant name; the descriptor is owned at once.
        let fd = unsafe { libc::memfd_create(c"isorun-input".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor, ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes)?;
        // SAFETY: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } < 0 {
            return Err(io::Error::last_os_error());
        }
        SharedMemory::from_fd(file.into())
    }

    /// A new sealed region written by `fill` piece by piece (so that a
    /// large converted input is never held whole in this process's memory).
    pub fn from_writes<E: From<io::Error>>(
        fill: impl FnOnce(&mut dyn Write) -> Result<(), E>,
    ) -> Result<SharedMemory, E> {
        // SAFETY: a constant name; the descriptor is owned at once.
        let fd = unsafe { libc::memfd_create(c"isorun-input".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(io::Error::last_os_error().into());
        }
        // SAFETY: a new descriptor, ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let file = std::fs::File::from(fd);
        let mut writer = io::BufWriter::with_capacity(1 << 20, &file);
        fill(&mut writer)?;
        writer.flush()?;
        drop(writer);
        // SAFETY: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } < 0 {
            return Err(io::Error::last_os_error().into());
        }
        Ok(SharedMemory::from_fd(file.into())?)
    }

    /// A new sealed region holding `len` bytes of `file` from `offset`,
    /// copied by the kernel (`sendfile`, or a 1 MiB buffer where it cannot
    /// be used): the caller's memory does not grow with `len`, since the
    /// region's pages are mapped here but never touched. What `.npy` inputs
    /// use, so that the supervisor never holds a large input twice.
    pub fn from_file(file: &std::fs::File, offset: u64, len: u64) -> io::Result<SharedMemory> {
        // SAFETY: a constant name; the descriptor is owned at once.
        let fd = unsafe { libc::memfd_create(c"isorun-input".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor, ours alone.
        let region = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let mut position = libc::off_t::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
        let mut left = len;
        while left > 0 {
            let chunk = left.min(1 << 30) as usize;
            // SAFETY: both descriptors are open; sendfile writes `position`.
            let sent = unsafe { libc::sendfile(region.as_raw_fd(), file.as_raw_fd(), &mut position, chunk) };
            if sent < 0 {
                let error = io::Error::last_os_error();
                if matches!(error.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) {
                    copy_with_buffer(file, &region, position as u64, left)?;
                    break;
                }
                return Err(error);
            }
            if sent == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file ended before its data"));
            }
            left -= sent as u64;
        }
        // SAFETY: fcntl on a descriptor we own.
        if unsafe { libc::fcntl(region.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } < 0 {
            return Err(io::Error::last_os_error());
        }
        SharedMemory::from_fd(region.into())
    }

    /// A region that is `len` bytes of `file` itself from `offset`: no copy
    /// at all, every worker maps the file's own pages (read only, through a
    /// read-only descriptor). Unlike a sealed region, the file's owner may
    /// still change or truncate it while workers read it (a truncation is
    /// then a SIGBUS, the unit's crash); for the user's own input files.
    pub fn from_file_view(file: &std::fs::File, offset: u64, len: u64) -> io::Result<SharedMemory> {
        let fd = OwnedFd::from(file.try_clone()?);
        SharedMemory::from_fd_view(fd, offset, len)
    }

    /// Maps `len` bytes of `fd` from `offset`, which must lie within the
    /// file (checked against its size).
    pub fn from_fd_view(fd: OwnedFd, offset: u64, len: u64) -> io::Result<SharedMemory> {
        // SAFETY: fstat writes only into stat.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above, on a descriptor we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let size = u64::try_from(stat.st_size).map_err(|_| io::Error::other("negative region size"))?;
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a region of {len} bytes at offset {offset} in a file of {size} bytes"),
            ));
        }
        let len = usize::try_from(len).map_err(|_| io::Error::other("region too large"))?;
        if len == 0 {
            let dangling = std::ptr::NonNull::<u8>::dangling().as_ptr().cast_const();
            let mapping = Mapping { fd, base: dangling, map_len: 0, address: dangling, len: 0, offset };
            return Ok(SharedMemory { mapping: Arc::new(mapping) });
        }
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let start = offset - offset % page;
        let delta = (offset - start) as usize;
        let map_len = len + delta;
        let map_offset = libc::off_t::try_from(start).map_err(|_| io::Error::other("offset too large"))?;
        // SAFETY: a fresh read-only shared mapping within the file (checked above).
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), map_len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), map_offset)
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = base as *const u8;
        // SAFETY: delta < page <= map_len: within the mapping.
        let address = unsafe { base.add(delta) };
        Ok(SharedMemory { mapping: Arc::new(Mapping { fd, base, map_len, address, len, offset }) })
    }

    /// `len` bytes of this region from `start`, as a view of the same
    /// descriptor (a duplicate): no byte is copied or read, and the view is
    /// checked against the file's size now (a user's file may have shrunk
    /// since this region was made: an error, not a fault later).
    pub fn sub_view(&self, start: u64, len: u64) -> io::Result<SharedMemory> {
        if start.checked_add(len).is_none_or(|end| end > self.mapping.len as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{len} bytes at {start} of a region of {} bytes", self.mapping.len),
            ));
        }
        SharedMemory::from_fd_view(self.mapping.fd.try_clone()?, self.mapping.offset + start, len)
    }

    /// Where the region lies in its descriptor's file: offset and length.
    pub fn view(&self) -> (u64, u64) {
        (self.mapping.offset, self.mapping.len as u64)
    }

    /// Feeds the region's bytes to `each` in chunks read through its
    /// descriptor, without touching the mapping (so without making the
    /// region resident in this process): for digests of large inputs.
    pub fn read_chunks(&self, mut each: impl FnMut(&[u8])) -> io::Result<()> {
        let mut buffer = vec![0u8; (1 << 20).min(self.mapping.len.max(1))];
        let mut done = 0u64;
        let file = std::fs::File::from(self.mapping.fd.try_clone()?);
        while done < self.mapping.len as u64 {
            let want = buffer.len().min((self.mapping.len as u64 - done) as usize);
            let n = std::os::unix::fs::FileExt::read_at(&file, &mut buffer[..want], self.mapping.offset + done)?;
            if n == 0 {
                break;
            }
            each(&buffer[..n]);
            done += n as u64;
        }
        Ok(())
    }

    /// Maps a whole region (read only, its whole size).
    pub fn from_fd(fd: OwnedFd) -> io::Result<SharedMemory> {
        // SAFETY: fstat writes only into stat.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above, on a descriptor we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let size = u64::try_from(stat.st_size).map_err(|_| io::Error::other("negative region size"))?;
        SharedMemory::from_fd_view(fd, 0, size)
    }

    /// Its descriptor, to send.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.mapping.fd.as_fd()
    }
}

impl std::ops::Deref for SharedMemory {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping lives as long as self, is read-only and sealed.
        unsafe { std::slice::from_raw_parts(self.mapping.address, self.mapping.len) }
    }
}

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedMemory({} bytes)", self.mapping.len)
    }
}

/// `len` bytes of `from` at `offset`, appended to `to` through a 1 MiB buffer.
fn copy_with_buffer(from: &std::fs::File, mut to: &std::fs::File, offset: u64, len: u64) -> io::Result<()> {
    let mut reader = io::BufReader::with_capacity(1 << 20, from.try_clone()?);
    io::Seek::seek(&mut reader, io::SeekFrom::Start(offset))?;
    let copied = io::copy(&mut reader.take(len), &mut to)?;
    if copied < len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the file ended before its data"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_holds_its_bytes_and_cannot_be_changed() {
        let region = SharedMemory::from_bytes(b"hello shared").unwrap();
        assert_eq!(&region[..], b"hello shared");
        let dup = region.fd().try_clone_to_owned().unwrap();
        let mut file = std::fs::File::from(dup);
        assert!(file.write_all(b"x").is_err(), "sealed against writes");
        assert!(file.set_len(1).is_err(), "sealed against shrinking");
        let again = SharedMemory::from_fd(region.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(&again[..], b"hello shared");
        let empty = SharedMemory::from_bytes(b"").unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn a_region_made_from_part_of_a_file_holds_that_part_sealed() {
        let mut file = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        file.write_all(&data).unwrap();
        let region = SharedMemory::from_file(&file, 1000, 2_000_000).unwrap();
        assert_eq!(&region[..], &data[1000..2_001_000]);
        let mut chunks = Vec::new();
        region.read_chunks(|chunk| chunks.extend_from_slice(chunk)).unwrap();
        assert_eq!(chunks, &data[1000..2_001_000]);
        let mut writable = std::fs::File::from(region.fd().try_clone_to_owned().unwrap());
        assert!(writable.write_all(b"x").is_err(), "sealed against writes");
        assert!(SharedMemory::from_file(&file, 2_999_000, 2000).is_err(), "past the end of the file");
    }

    #[test]
    fn a_view_maps_the_file_itself_at_any_offset_and_stays_within_it() {
        let mut file = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        file.write_all(&data).unwrap();
        // Not page-aligned: 4096 + 128.
        let view = SharedMemory::from_file_view(&file, 4224, 50_000).unwrap();
        assert_eq!(&view[..], &data[4224..54_224]);
        assert_eq!(view.view(), (4224, 50_000));
        let mut chunks = Vec::new();
        view.read_chunks(|chunk| chunks.extend_from_slice(chunk)).unwrap();
        assert_eq!(chunks, &data[4224..54_224]);
        // What a worker receives: the descriptor and the view, checked against the file.
        let again = SharedMemory::from_fd_view(view.fd().try_clone_to_owned().unwrap(), 4224, 50_000).unwrap();
        assert_eq!(&again[..], &view[..]);
        for (offset, len) in [(99_999, 2), (0, 100_001), (u64::MAX, 1)] {
            let fd = view.fd().try_clone_to_owned().unwrap();
            assert!(SharedMemory::from_fd_view(fd, offset, len).is_err(), "{offset}+{len} is outside the file");
        }
    }
}
