//! A symbol of an ELF64 little-endian shared library's symbol table (the
//! full `.symtab`, which the dynamic linker does not read, else `.dynsym`),
//! by name or by index, read with positioned reads and nothing else. The
//! build scripts use it (a `#[path]` module of `libtensorflow_build.rs`) to
//! find, once, the index of oneDNN's `dnnl_threadpool_interop_sgemm` in the
//! libtensorflow they link; the worker's `--index-symbols` scan
//! (`symbol_index.rs`) finds it in the library a zygote actually loaded;
//! and the zygote (`onednn.rs`) checks, in a few small reads, that the
//! symbol at that index still has that name. Every offset, size and count
//! is checked against the file: a library that lies about them gives
//! `None`, never a read out of bounds; a scan reads in fixed chunks, never
//! a buffer sized from what the file says.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// What one symbol table entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElfSymbol {
    /// `st_value`: its address relative to the library's load address.
    pub value: u64,
    /// `st_size`.
    pub size: u64,
    /// `STT_*`, the low four bits of `st_info`.
    pub kind: u8,
}

/// `STT_FUNC`.
pub const STT_FUNC: u8 = 2;

const SHT_SYMTAB: u32 = 2;
const SHT_STRTAB: u32 = 3;
const SHT_DYNSYM: u32 = 11;
const SYMBOL_BYTES: u64 = 24;
/// A name longer than this is not one we look for.
const MAX_NAME: usize = 256;

/// The symbol table's and its string table's places in the file.
struct Tables {
    symtab_offset: u64,
    symbols: u64,
    strtab_offset: u64,
    strtab_size: u64,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default())
}

fn read(file: &File, offset: u64, len: usize) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset).ok()?;
    Some(buf)
}

/// Finds `.symtab` (else `.dynsym`) and the string table it links to.
fn tables(file: &File) -> Option<Tables> {
    let file_len = file.metadata().ok()?.len();
    let header = read(file, 0, 64)?;
    // ELF magic, 64-bit, little-endian.
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let shoff = u64_at(&header, 0x28);
    let shentsize = u64::from(u16_at(&header, 0x3a));
    let shnum = u64::from(u16_at(&header, 0x3c));
    if !(64..=256).contains(&shentsize) || shnum == 0 || shnum > 4096 {
        return None;
    }
    let all = shentsize.checked_mul(shnum)?;
    if shoff.checked_add(all)? > file_len {
        return None;
    }
    let sections = read(file, shoff, all as usize)?;
    let section = |i: u64| {
        let at = (i * shentsize) as usize;
        let s = &sections[at..at + 64];
        (u32_at(s, 4), u64_at(s, 0x18), u64_at(s, 0x20), u32_at(s, 0x28), u64_at(s, 0x38))
    };
    let symtab = (0..shnum)
        .map(section)
        .find(|s| s.0 == SHT_SYMTAB)
        .or_else(|| (0..shnum).map(section).find(|s| s.0 == SHT_DYNSYM))?;
    let (_, symtab_offset, symtab_size, link, entsize) = symtab;
    if entsize != SYMBOL_BYTES || u64::from(link) >= shnum || symtab_offset.checked_add(symtab_size)? > file_len {
        return None;
    }
    let (kind, strtab_offset, strtab_size, _, _) = section(u64::from(link));
    if kind != SHT_STRTAB || strtab_offset.checked_add(strtab_size)? > file_len {
        return None;
    }
    Some(Tables { symtab_offset, symbols: symtab_size / SYMBOL_BYTES, strtab_offset, strtab_size })
}

fn parse_symbol(entry: &[u8]) -> (u32, ElfSymbol) {
    let name = u32_at(entry, 0);
    (name, ElfSymbol { value: u64_at(entry, 8), size: u64_at(entry, 16), kind: entry[4] & 0xf })
}

/// The symbol at `index` of `file`'s `.symtab`, if it is named `name`.
pub fn symbol_named_at(file: &File, index: u64, name: &str) -> Option<ElfSymbol> {
    let t = tables(file)?;
    if index >= t.symbols || name.len() > MAX_NAME {
        return None;
    }
    let entry = read(file, t.symtab_offset + index * SYMBOL_BYTES, SYMBOL_BYTES as usize)?;
    let (name_at, symbol) = parse_symbol(&entry);
    // The name and its terminating NUL, inside the string table.
    let len = name.len() as u64 + 1;
    if u64::from(name_at).checked_add(len)? > t.strtab_size {
        return None;
    }
    let found = read(file, t.strtab_offset + u64::from(name_at), len as usize)?;
    (found[..name.len()] == *name.as_bytes() && found[name.len()] == 0).then_some(symbol)
}

/// What a search of a file's symbol table for a name found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The index of the first symbol of that name.
    At(u64),
    /// The table has no symbol of that name.
    Absent,
    /// No symbol table to search: not an ELF64 little-endian file, or one
    /// with neither `.symtab` nor `.dynsym`, or whose tables lie outside it.
    NoTable,
}

/// Bytes a scan reads at a time.
const CHUNK: u64 = 1 << 20;
/// Places in the string table a scan keeps where the name ends: a name is
/// rarely there more than once (a string table shares tails, so a longer
/// name may end in it).
const MAX_PLACES: usize = 64;

/// Searches `file`'s symbol table for the first symbol named `name`: the
/// string table for the places the name (and its NUL) is, then the symbols
/// for one that points at one of them. Reads both tables in 1 MiB chunks
/// (a ~200 MB read for libtensorflow: for a build script or a scan of its
/// own, not for a process start).
pub fn look_up(file: &File, name: &str) -> std::io::Result<Lookup> {
    let Some(t) = tables(file) else { return Ok(Lookup::NoTable) };
    let wanted = name.as_bytes();
    let n = wanted.len() as u64;
    if n == 0 || wanted.len() > MAX_NAME || wanted.contains(&0) {
        return Ok(Lookup::Absent);
    }
    // Where the name and its NUL are: each chunk is read with the `n`
    // bytes after it, so that a name across two chunks is seen, and keeps
    // the places that start in it. Horspool's search: it looks at one byte
    // in ~20 here, fast even unoptimised.
    let needle: Vec<u8> = wanted.iter().copied().chain([0]).collect();
    let m = needle.len();
    let mut shift = [m; 256];
    for (i, &b) in needle[..m - 1].iter().enumerate() {
        shift[usize::from(b)] = m - 1 - i;
    }
    let mut places: Vec<u64> = Vec::new();
    let mut buffer = vec![0u8; (CHUNK + n) as usize];
    let mut start = 0u64;
    while start < t.strtab_size && places.len() < MAX_PLACES {
        let len = (CHUNK + n).min(t.strtab_size - start) as usize;
        let chunk = &mut buffer[..len];
        file.read_exact_at(chunk, t.strtab_offset + start)?;
        let mut at = 0usize;
        while at + m <= len && at < CHUNK as usize && places.len() < MAX_PLACES {
            let last = chunk[at + m - 1];
            if last == 0 && chunk[at..at + m - 1] == needle[..m - 1] {
                places.push(start + at as u64);
            }
            at += shift[usize::from(last)];
        }
        start += CHUNK;
    }
    if places.is_empty() {
        return Ok(Lookup::Absent);
    }
    let per_chunk = CHUNK / SYMBOL_BYTES;
    let mut first = 0u64;
    while first < t.symbols {
        let count = per_chunk.min(t.symbols - first);
        let chunk = &mut buffer[..(count * SYMBOL_BYTES) as usize];
        file.read_exact_at(chunk, t.symtab_offset + first * SYMBOL_BYTES)?;
        let found = chunk.chunks_exact(SYMBOL_BYTES as usize).position(|entry| {
            let (name_at, _) = parse_symbol(entry);
            places.contains(&u64::from(name_at))
        });
        if let Some(i) = found {
            return Ok(Lookup::At(first + i as u64));
        }
        first += count;
    }
    Ok(Lookup::Absent)
}

/// The index of the first symbol named `name` in `file`'s symbol table.
pub fn index_of(file: &File, name: &str) -> Option<u64> {
    match look_up(file, name) {
        Ok(Lookup::At(index)) => Some(index),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// An ELF64 file of a header, a string table `\0sgemm\0other\0`, two
    /// symbols (`sgemm`, a function at 0x1000 of 64 bytes; `other`) and three
    /// section headers (null, `.symtab` linking to section `link`, `.strtab`).
    fn elf(link: u32, strtab_size: u64) -> Vec<u8> {
        elf_of(b"\0sgemm\0other\0", [1, 7], link, strtab_size, SHT_SYMTAB)
    }

    /// An ELF64 file as [`elf`] describes, of string table `strtab`, its two
    /// symbols named at `names`, its symbol table of section type `table`.
    fn elf_of(strtab: &[u8], names: [u32; 2], link: u32, strtab_size: u64, table: u32) -> Vec<u8> {
        let mut symbols = vec![0u8; 48];
        symbols[0..4].copy_from_slice(&names[0].to_le_bytes());
        symbols[4] = 0x12; // global function
        symbols[8..16].copy_from_slice(&0x1000u64.to_le_bytes());
        symbols[16..24].copy_from_slice(&64u64.to_le_bytes());
        symbols[24..28].copy_from_slice(&names[1].to_le_bytes());
        let (strtab_at, symtab_at) = (64u64, 64 + strtab.len() as u64);
        let shoff = symtab_at + symbols.len() as u64;
        let mut out = vec![0u8; 64];
        out[..6].copy_from_slice(b"\x7fELF\x02\x01");
        out[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        out[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        out[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
        out.extend_from_slice(strtab);
        out.extend_from_slice(&symbols);
        let section = |kind: u32, offset: u64, size: u64, link: u32, entsize: u64| {
            let mut s = vec![0u8; 64];
            s[4..8].copy_from_slice(&kind.to_le_bytes());
            s[0x18..0x20].copy_from_slice(&offset.to_le_bytes());
            s[0x20..0x28].copy_from_slice(&size.to_le_bytes());
            s[0x28..0x2c].copy_from_slice(&link.to_le_bytes());
            s[0x38..0x40].copy_from_slice(&entsize.to_le_bytes());
            s
        };
        out.extend(section(0, 0, 0, 0, 0));
        out.extend(section(table, symtab_at, symbols.len() as u64, link, SYMBOL_BYTES));
        out.extend(section(SHT_STRTAB, strtab_at, strtab_size, 0, 0));
        out
    }

    fn file(bytes: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn a_symbol_is_found_by_name_and_checked_by_index() {
        let f = file(&elf(2, 13));
        assert_eq!(index_of(&f, "sgemm"), Some(0));
        assert_eq!(index_of(&f, "other"), Some(1));
        assert_eq!(index_of(&f, "sgem"), None, "a prefix is not the name");
        let want = ElfSymbol { value: 0x1000, size: 64, kind: STT_FUNC };
        assert_eq!(symbol_named_at(&f, 0, "sgemm"), Some(want));
        assert_eq!(symbol_named_at(&f, 1, "sgemm"), None);
        assert_eq!(symbol_named_at(&f, 2, "sgemm"), None, "past the table");
        assert_eq!(symbol_named_at(&f, u64::MAX, "sgemm"), None);
    }

    #[test]
    fn a_file_that_lies_about_its_tables_gives_nothing() {
        // A string table that claims to run past the file.
        assert_eq!(index_of(&file(&elf(2, 1 << 40)), "sgemm"), None);
        // A string table too short for the name.
        assert_eq!(symbol_named_at(&file(&elf(2, 4)), 0, "sgemm"), None);
        // A link to a section that is not a string table, or not there.
        assert_eq!(symbol_named_at(&file(&elf(1, 13)), 0, "sgemm"), None);
        assert_eq!(symbol_named_at(&file(&elf(9, 13)), 0, "sgemm"), None);
        // Truncated anywhere: nothing, and no panic.
        let whole = elf(2, 13);
        for len in 0..whole.len() {
            let f = file(&whole[..len]);
            assert_eq!(symbol_named_at(&f, 0, "sgemm"), None, "{len} bytes");
            assert_eq!(index_of(&f, "sgemm"), None, "{len} bytes");
        }
        // Not ELF64 little-endian.
        let mut big = whole.clone();
        big[5] = 2;
        assert_eq!(index_of(&file(&big), "sgemm"), None);
    }

    #[test]
    fn a_dynamic_symbol_table_serves_where_there_is_no_full_one() {
        let f = file(&elf_of(b"\0sgemm\0other\0", [1, 7], 2, 13, SHT_DYNSYM));
        assert_eq!(look_up(&f, "other").unwrap(), Lookup::At(1));
        assert_eq!(symbol_named_at(&f, 0, "sgemm").map(|s| s.value), Some(0x1000));
        // A section of neither kind is no table.
        assert_eq!(look_up(&file(&elf_of(b"\0sgemm\0other\0", [1, 7], 2, 13, 1)), "sgemm").unwrap(), Lookup::NoTable);
        assert_eq!(look_up(&file(b"not an ELF file at all"), "sgemm").unwrap(), Lookup::NoTable);
    }

    #[test]
    fn a_scan_finds_a_name_across_its_chunks_and_as_a_shared_tail() {
        // `sgemm` straddles the first 1 MiB boundary; the first symbol is
        // named `xsgemm` and the second points into its tail, `sgemm`.
        let mut strtab = vec![b'a'; CHUNK as usize - 3];
        strtab[0] = 0;
        let at = strtab.len() as u32;
        strtab.extend_from_slice(b"xsgemm\0other\0");
        let f = file(&elf_of(&strtab, [at, at + 1], 2, strtab.len() as u64, SHT_SYMTAB));
        assert_eq!(look_up(&f, "sgemm").unwrap(), Lookup::At(1));
        assert_eq!(look_up(&f, "xsgemm").unwrap(), Lookup::At(0));
        assert_eq!(look_up(&f, "gemm").unwrap(), Lookup::Absent, "a tail no symbol starts at");
        assert_eq!(look_up(&f, "other").unwrap(), Lookup::Absent, "in the strings, but no symbol's name");
        assert_eq!(look_up(&f, "sgemmx").unwrap(), Lookup::Absent);
        assert_eq!(symbol_named_at(&f, 1, "sgemm").map(|s| s.kind), Some(0));
    }
}
