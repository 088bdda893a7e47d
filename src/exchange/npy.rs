//! NumPy's `.npy` format (version 1.0, and 2.0/3.0 on reading): C order, little-endian, the
//! element types `export` writes and `check` reads. Nothing else is accepted, and a refusal
//! says what the file holds and what to write instead.

use std::path::{Path, PathBuf};

const MAGIC: &[u8] = b"\x93NUMPY";

/// The element types sdpa-runner exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    U8,
    U16,
    F16,
    F32,
    F64,
}

impl Dtype {
    pub fn descr(self) -> &'static str {
        match self {
            Dtype::U8 => "|u1",
            Dtype::U16 => "<u2",
            Dtype::F16 => "<f2",
            Dtype::F32 => "<f4",
            Dtype::F64 => "<f8",
        }
    }

    pub fn size(self) -> usize {
        match self {
            Dtype::U8 => 1,
            Dtype::U16 | Dtype::F16 => 2,
            Dtype::F32 => 4,
            Dtype::F64 => 8,
        }
    }

    fn from_descr(descr: &str) -> Option<Self> {
        match descr {
            "|u1" | "<u1" | "u1" => Some(Dtype::U8),
            "<u2" => Some(Dtype::U16),
            "<f2" => Some(Dtype::F16),
            "<f4" => Some(Dtype::F32),
            "<f8" => Some(Dtype::F64),
            _ => None,
        }
    }
}

/// An array read from a `.npy` file: its type, shape and raw little-endian bytes.
#[derive(Debug, Clone)]
pub struct Array {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// Why a file is not an array sdpa-runner reads.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a .npy file ({why}); write it with numpy.save")]
    Format { path: PathBuf, why: String },
    #[error(
        "{path} holds {what}; write a C-order little-endian array of float16, float32, float64, \
         uint16 or uint8"
    )]
    Unsupported { path: PathBuf, what: String },
    #[error(
        "{path} does not hold what its header says: {expected} bytes of data promised, {got} there"
    )]
    SizeMismatch {
        path: PathBuf,
        expected: usize,
        got: usize,
    },
}

/// The bytes of a `.npy` file holding `data` (already little-endian) of `dtype` and `shape`.
pub fn encode(dtype: Dtype, shape: &[usize], data: &[u8]) -> Vec<u8> {
    assert_eq!(shape.iter().product::<usize>() * dtype.size(), data.len());
    let dims: Vec<String> = shape.iter().map(|n| n.to_string()).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_text}, }}",
        dtype.descr()
    );
    // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
    let unpadded = MAGIC.len() + 2 + 2 + header.len() + 1;
    header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// f32 values as a `.npy` file.
pub fn encode_f32(shape: &[usize], values: &[f32]) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    encode(Dtype::F32, shape, &data)
}

/// Reads a `.npy` file.
pub fn read(path: &Path) -> Result<Array, NpyError> {
    let bytes = std::fs::read(path).map_err(|source| NpyError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decode(path, &bytes)
}

/// Parses the bytes of a `.npy` file (`path` names it in errors).
pub fn decode(path: &Path, bytes: &[u8]) -> Result<Array, NpyError> {
    let format = |why: &str| NpyError::Format {
        path: path.to_path_buf(),
        why: why.into(),
    };
    if bytes.len() < 10 || !bytes.starts_with(MAGIC) {
        return Err(format("no NUMPY magic at its start"));
    }
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(format(&format!("unknown version {v}"))),
    };
    let header = bytes
        .get(start..start + len)
        .ok_or_else(|| format("its header is cut short"))?;
    let header = std::str::from_utf8(header).map_err(|_| format("its header is not text"))?;
    let unsupported = |what: String| NpyError::Unsupported {
        path: path.to_path_buf(),
        what,
    };
    let descr = dict_value(header, "descr").ok_or_else(|| format("its header has no descr"))?;
    let descr = descr.trim_matches(|c| c == '\'' || c == '"');
    let dtype = Dtype::from_descr(descr)
        .ok_or_else(|| unsupported(format!("elements of type `{descr}`")))?;
    match dict_value(header, "fortran_order") {
        Some("False") => {}
        Some("True") => return Err(unsupported("a Fortran-order array".into())),
        _ => return Err(format("its header has no fortran_order")),
    }
    let shape_text =
        dict_value(header, "shape").ok_or_else(|| format("its header has no shape"))?;
    let shape = parse_shape(shape_text).ok_or_else(|| format("its shape is not a tuple"))?;
    let data = &bytes[start + len..];
    let expected = shape
        .iter()
        .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
        .ok_or_else(|| format("its shape overflows"))?;
    if data.len() != expected {
        return Err(NpyError::SizeMismatch {
            path: path.to_path_buf(),
            expected,
            got: data.len(),
        });
    }
    Ok(Array {
        dtype,
        shape,
        data: data.to_vec(),
    })
}

/// The text of `key`'s value in a Python dict literal: up to the next `,` outside
/// parentheses, or the closing brace.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = ["'", "\""].iter().find_map(|q| {
        header
            .find(&format!("{q}{key}{q}"))
            .map(|i| i + key.len() + 2)
    })?;
    let rest = header[at..].trim_start().strip_prefix(':')?.trim_start();
    let mut depth = 0;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&rest[..=i]);
                }
            }
            ',' | '}' if depth == 0 => return Some(rest[..i].trim_end()),
            _ => {}
        }
    }
    None
}

/// `(2, 3)`, `(5,)`, `()`.
fn parse_shape(text: &str) -> Option<Vec<usize>> {
    let inner = text.strip_prefix('(')?.strip_suffix(')')?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| t.trim_end_matches('L').parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("x.npy")
    }

    #[test]
    fn an_encoded_array_reads_back_with_its_type_shape_and_bytes_and_a_64_byte_header() {
        let values = [1.5f32, -2.0, 3.25, 0.0, 7.0, 1e-3];
        let bytes = encode_f32(&[2, 3], &values);
        let header_end = bytes.len() - 24;
        assert_eq!(header_end % 64, 0);
        assert_eq!(bytes[header_end - 1], b'\n');
        let a = decode(p(), &bytes).unwrap();
        assert_eq!((a.dtype, a.shape.clone()), (Dtype::F32, vec![2, 3]));
        let back: Vec<f32> = a
            .data
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(back, values);
        let one = decode(p(), &encode(Dtype::U8, &[3], &[1, 2, 3])).unwrap();
        assert_eq!((one.dtype, one.shape), (Dtype::U8, vec![3]));
    }

    /// The header numpy 2.x writes for `np.save(f, np.zeros((2, 4), np.float16))`.
    #[test]
    fn numpys_own_header_is_read() {
        let mut header = "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 4), }".to_string();
        let unpadded = 10 + header.len() + 1;
        header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
        header.push('\n');
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&[1, 0]);
        bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[0u8; 16]);
        let a = decode(p(), &bytes).unwrap();
        assert_eq!((a.dtype, a.shape), (Dtype::F16, vec![2, 4]));
    }

    #[test]
    fn what_is_not_read_is_refused_naming_the_file_and_the_reason() {
        let edit = |from: &str, to: &str| {
            let mut bytes = encode(Dtype::F32, &[1], &[0; 4]);
            let at = bytes
                .windows(from.len())
                .position(|w| w == from.as_bytes())
                .unwrap();
            bytes[at..at + from.len()].copy_from_slice(to.as_bytes());
            bytes
        };
        let fortran = edit("'fortran_order': False", "'fortran_order': True ");
        let big_endian = edit("<f4", ">f4");
        let mut short = encode(Dtype::F32, &[4], &[0; 16]);
        short.truncate(short.len() - 3);
        for (bytes, needle) in [
            (b"hello".to_vec(), "not a .npy file"),
            (fortran, "Fortran-order"),
            (big_endian, "`>f4`"),
            (short, "bytes of data promised"),
        ] {
            let err = decode(p(), &bytes).unwrap_err().to_string();
            assert!(err.contains("x.npy") && err.contains(needle), "{err}");
        }
    }
}
