//! Large input tensors, written once by the supervisor and mapped by every
//! worker: a sealed `memfd`. Sealing (no write, grow or shrink, no new
//! seal) makes the region immutable for everyone holding it, so a worker
//! can neither change the inputs another worker reads nor make a reader
//! fault by truncating the file behind its mapping. It travels as a file
//! descriptor (`SCM_RIGHTS`) on the worker's socket (`request.rs`).

use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// A read-only shared region; clones share one mapping.
#[derive(Clone)]
pub struct SharedMemory {
    mapping: Arc<Mapping>,
}

struct Mapping {
    fd: OwnedFd,
    address: *const u8,
    len: usize,
}

// SAFETY: the mapping is read-only for its whole life and sealed against
// writes, so sharing its address between threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: address and len are those mmap returned; nothing borrows them any more.
            unsafe { libc::munmap(self.address as *mut libc::c_void, self.len) };
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

    /// Maps a region received from the supervisor (read only, its whole size).
    pub fn from_fd(fd: OwnedFd) -> io::Result<SharedMemory> {
        // SAFETY: fstat writes only into stat.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above, on a descriptor we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut stat) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let len = usize::try_from(stat.st_size).map_err(|_| io::Error::other("negative region size"))?;
        let address = if len == 0 {
            std::ptr::NonNull::<u8>::dangling().as_ptr().cast_const()
        } else {
            // SAFETY: a fresh read-only shared mapping of the whole file.
            let address =
                unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
            if address == libc::MAP_FAILED {
                return Err(io::Error::last_os_error());
            }
            address as *const u8
        };
        Ok(SharedMemory { mapping: Arc::new(Mapping { fd, address, len }) })
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
}
