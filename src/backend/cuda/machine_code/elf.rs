//! The parts of a CUBIN (a 64-bit little-endian ELF file, as NVRTC and ptxas write it) that
//! machine code is compared by: sections, symbol names, relocations by symbol name, and the
//! per-symbol values of `.nv.info`. Every read is bounds-checked: a malformed file is an error,
//! never a panic.

use std::collections::BTreeMap;

const SHT_SYMTAB: u32 = 2;
const SHT_RELA: u32 = 4;
const SHT_NOBITS: u32 = 8;
const SHT_REL: u32 = 9;
pub const SHF_ALLOC: u64 = 0x2;
/// Set on the sections that belong to one function (`.nv.shared.<name>`, `.nv.constant0.<name>`).
pub const SHF_INFO_LINK: u64 = 0x40;
const EIFMT_SVAL: u8 = 0x04;

pub struct Section {
    pub name: String,
    kind: u32,
    pub flags: u64,
    offset: usize,
    pub size: usize,
    link: usize,
    info: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Relocation {
    pub offset: u64,
    pub kind: u32,
    /// By name: symbol indices are renumbered between builds.
    pub symbol: String,
    pub addend: i64,
}

pub struct Elf<'a> {
    data: &'a [u8],
    pub sections: Vec<Section>,
    symbols: Vec<String>,
}

impl<'a> Elf<'a> {
    pub fn read(data: &'a [u8]) -> Result<Self, String> {
        if data.len() < 64 || &data[..4] != b"\x7fELF" || data[4] != 2 || data[5] != 1 {
            return Err("not a 64-bit little-endian ELF file".into());
        }
        let sections = sections(data)?;
        let symbols = symbols(data, &sections)?;
        Ok(Elf {
            data,
            sections,
            symbols,
        })
    }

    /// A section's bytes (none for one that takes no room in the file, such as `.nv.global`).
    pub fn body(&self, s: &Section) -> Result<&'a [u8], String> {
        if s.kind == SHT_NOBITS {
            return Ok(&[]);
        }
        self.data
            .get(s.offset..s.offset.saturating_add(s.size))
            .ok_or_else(|| format!("section {} lies past the end of the file", s.name))
    }

    pub fn named(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The relocations applied to section `target` (by index), from REL and RELA sections.
    pub fn relocations_of(&self, target: usize) -> Result<Vec<Relocation>, String> {
        let mut out = Vec::new();
        for s in self.sections.iter().filter(|s| s.info == target) {
            let (entry, with_addend) = match s.kind {
                SHT_RELA => (24, true),
                SHT_REL => (16, false),
                _ => continue,
            };
            let data = self.body(s)?;
            if data.len() % entry != 0 {
                return Err(format!("{} is not a whole number of entries", s.name));
            }
            for e in data.chunks_exact(entry) {
                let info = u64_at(e, 8)?;
                let index = usize::try_from(info >> 32).map_err(|_| "relocation symbol")?;
                out.push(Relocation {
                    offset: u64_at(e, 0)?,
                    kind: (info & 0xffff_ffff) as u32,
                    symbol: self.symbols.get(index).cloned().ok_or_else(|| {
                        format!("{} names symbol {index}, past the symbol table", s.name)
                    })?,
                    addend: if with_addend {
                        u64_at(e, 16)? as i64
                    } else {
                        0
                    },
                });
            }
        }
        Ok(out)
    }

    /// `.nv.info`'s attributes of 4-byte values keyed by a symbol (registers, stack sizes):
    /// symbol name -> attribute -> value.
    pub fn symbol_attributes(&self) -> Result<BTreeMap<String, BTreeMap<u8, u32>>, String> {
        let mut out: BTreeMap<String, BTreeMap<u8, u32>> = BTreeMap::new();
        let Some(info) = self.named(".nv.info") else {
            return Ok(out);
        };
        let data = self.body(info)?;
        let mut at = 0;
        while at < data.len() {
            let [format, attribute] = field::<2>(data, at)?;
            // EIFMT_SVAL: a 2-byte size, then that many bytes; the other formats (no value, a
            // byte, a half word) take 4 bytes in all.
            let payload = if format == EIFMT_SVAL {
                usize::from(u16_at(data, at + 2)?)
            } else {
                0
            };
            if format == EIFMT_SVAL && payload == 8 {
                let symbol = u32_at(data, at + 4)? as usize;
                let name = self
                    .symbols
                    .get(symbol)
                    .ok_or_else(|| format!(".nv.info names symbol {symbol}, past the table"))?;
                out.entry(name.clone())
                    .or_default()
                    .insert(attribute, u32_at(data, at + 8)?);
            }
            at += 4 + payload;
        }
        if at != data.len() {
            return Err(".nv.info's attributes overrun the section".into());
        }
        Ok(out)
    }
}

fn sections(d: &[u8]) -> Result<Vec<Section>, String> {
    let shoff = usize::try_from(u64_at(d, 0x28)?).map_err(|_| "section headers' offset")?;
    let entsize = usize::from(u16_at(d, 0x3a)?);
    let count = usize::from(u16_at(d, 0x3c)?);
    let names_index = usize::from(u16_at(d, 0x3e)?);
    if entsize < 64 {
        return Err(format!("section headers of {entsize} bytes"));
    }
    let mut raw = Vec::with_capacity(count);
    for i in 0..count {
        let at = shoff.saturating_add(i * entsize);
        let h = d
            .get(at..at.saturating_add(64))
            .ok_or_else(|| format!("section header {i} lies past the end of the file"))?;
        let offset = usize::try_from(u64_at(h, 0x18)?).map_err(|_| "section offset")?;
        let size = usize::try_from(u64_at(h, 0x20)?).map_err(|_| "section size")?;
        raw.push((
            u32_at(h, 0)? as usize,
            u32_at(h, 4)?,
            u64_at(h, 8)?,
            offset,
            size,
            u32_at(h, 0x28)? as usize,
            u32_at(h, 0x2c)? as usize,
        ));
    }
    let &(_, _, _, names_at, names_size, _, _) =
        raw.get(names_index).ok_or("no section-name table")?;
    raw.into_iter()
        .map(|(name, kind, flags, offset, size, link, info)| {
            Ok(Section {
                name: c_string(d, names_at, names_size, name)?,
                kind,
                flags,
                offset,
                size,
                link,
                info,
            })
        })
        .collect()
}

/// Every symbol's name, by index.
fn symbols(d: &[u8], sections: &[Section]) -> Result<Vec<String>, String> {
    let Some(table) = sections.iter().find(|s| s.kind == SHT_SYMTAB) else {
        return Ok(Vec::new());
    };
    let strings = sections
        .get(table.link)
        .ok_or("the symbol table has no string table")?;
    (0..table.size / 24)
        .map(|i| {
            let name = u32_at(d, table.offset.saturating_add(24 * i))? as usize;
            c_string(d, strings.offset, strings.size, name)
        })
        .collect()
}

/// The NUL-terminated name at `at` of the string table at `table` (`size` bytes).
fn c_string(d: &[u8], table: usize, size: usize, at: usize) -> Result<String, String> {
    let bytes = d
        .get(table.saturating_add(at)..table.saturating_add(size))
        .ok_or_else(|| format!("a name at {at} lies outside its string table"))?;
    let end = bytes
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| format!("the name at {at} of a string table is not terminated"))?;
    Ok(String::from_utf8_lossy(&bytes[..end]).into_owned())
}

pub fn u16_at(d: &[u8], at: usize) -> Result<u16, String> {
    Ok(u16::from_le_bytes(field(d, at)?))
}

pub fn u32_at(d: &[u8], at: usize) -> Result<u32, String> {
    Ok(u32::from_le_bytes(field(d, at)?))
}

pub fn u64_at(d: &[u8], at: usize) -> Result<u64, String> {
    Ok(u64::from_le_bytes(field(d, at)?))
}

fn field<const N: usize>(d: &[u8], at: usize) -> Result<[u8; N], String> {
    d.get(at..at.saturating_add(N))
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| format!("a {N}-byte field at {at} lies past the end of the data"))
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// The file offset of the section header of `name` in `cubin` (for tests that patch one).
    pub fn header_of(cubin: &[u8], name: &str) -> usize {
        let elf = Elf::read(cubin).unwrap();
        let i = elf.sections.iter().position(|s| s.name == name).unwrap();
        let shoff = u64_at(cubin, 0x28).unwrap() as usize;
        shoff + i * usize::from(u16_at(cubin, 0x3a).unwrap())
    }

    /// The file offset of the section `name`'s bytes.
    pub fn body_of(cubin: &[u8], name: &str) -> usize {
        u64_at(cubin, header_of(cubin, name) + 0x18).unwrap() as usize
    }

    const A: &[u8] = include_bytes!("testdata/machine_code_a.cubin");

    #[test]
    fn a_truncated_or_foreign_file_is_an_error_not_a_panic() {
        assert!(Elf::read(b"not an elf").is_err());
        let headers_end =
            u64_at(A, 0x28).unwrap() as usize + 64 * usize::from(u16_at(A, 0x3c).unwrap());
        for cut in [64, 200, A.len() / 2, headers_end - 1] {
            // Every cut loses a section header or a section some header points into.
            let parsed = Elf::read(&A[..cut]).and_then(|e| {
                let bodies: Result<Vec<_>, _> = e.sections.iter().map(|s| e.body(s)).collect();
                bodies.map(|_| ())
            });
            assert!(parsed.is_err(), "cut at {cut}");
        }
        let mut wrong_class = A.to_vec();
        wrong_class[4] = 1;
        assert!(Elf::read(&wrong_class).is_err());
    }

    #[test]
    fn an_info_section_one_byte_longer_is_an_error_not_a_panic() {
        let mut longer = A.to_vec();
        let size = header_of(A, ".nv.info") + 0x20;
        let n = u64_at(A, size).unwrap();
        longer[size..size + 8].copy_from_slice(&(n + 1).to_le_bytes());
        let elf = Elf::read(&longer).unwrap();
        assert!(elf.symbol_attributes().is_err());
    }

    #[test]
    fn a_relocation_section_of_a_partial_entry_is_an_error() {
        let mut cut = A.to_vec();
        let size = header_of(A, ".rela.nv.constant4") + 0x20;
        let n = u64_at(A, size).unwrap();
        cut[size..size + 8].copy_from_slice(&(n - 1).to_le_bytes());
        let elf = Elf::read(&cut).unwrap();
        let target = elf
            .sections
            .iter()
            .position(|s| s.name == ".nv.constant4")
            .unwrap();
        assert!(elf.relocations_of(target).is_err());
    }

    #[test]
    fn an_unterminated_name_is_an_error() {
        assert!(c_string(b"abc", 0, 3, 0).is_err());
        assert_eq!(c_string(b"ab\0c", 0, 4, 0).unwrap(), "ab");
        assert!(c_string(b"ab\0c", 0, 4, 9).is_err());
    }
}
