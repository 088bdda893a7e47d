//! An implementation's outputs (`check --outputs OUT`): `OUT/<id>.npy` per problem and an
//! optional `OUT/implementation.json` that names the implementation, what it read, and what
//! a file alone cannot say (that uint16 is bf16, an e4m3 output's scale, its timings).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use serde::{Deserialize, Serialize};

use super::npy::{self, Dtype};
use crate::reference::{OutputFormat, Precision};
use crate::usage::ConfigError;

/// `OUT/implementation.json`: every key optional.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImplementationFile {
    /// Shown in the tables [default: the folder's name].
    #[serde(default)]
    pub name: Option<String>,
    /// What it read and computed in (`check --precision` overrides nothing: they must agree).
    #[serde(default)]
    pub precision: Option<Precision>,
    /// What uint16 outputs hold: `bf16` (the only meaning).
    #[serde(default)]
    pub u16: Option<String>,
    /// Per problem id: the output's scale (e4m3 outputs), its median time, a note.
    #[serde(default)]
    pub problems: BTreeMap<String, ProblemFacts>,
    /// Anything the writer wants kept (versions, the backend's name).
    #[serde(default)]
    pub about: BTreeMap<String, serde_json::Value>,
}

/// What an implementation says of one of its outputs.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProblemFacts {
    /// O = decode(code) · o_scale for uint8 (e4m3) outputs.
    #[serde(default)]
    pub o_scale: Option<f64>,
    /// Median forward time, microseconds.
    #[serde(default)]
    pub p50_us: Option<f64>,
    /// Why the implementation wrote no output, if it did not (shown beside the FAIL).
    #[serde(default)]
    pub note: Option<String>,
}

/// The file's name inside OUT.
pub const IMPLEMENTATION_FILE: &str = "implementation.json";

impl ImplementationFile {
    /// `OUT/implementation.json`, or the defaults when there is none.
    pub fn load(out: &Path) -> Result<Self, ConfigError> {
        let path = out.join(IMPLEMENTATION_FILE);
        let Some(text) = crate::json::read_found_text_if_any(&path)? else {
            return Ok(Self::default());
        };
        let file: Self = crate::json::from_str_with_path(&path, &text)?;
        if let Some(u) = &file.u16
            && u != "bf16"
        {
            return Err(ConfigError::invalid_key(
                &path,
                "u16",
                format!("`{u}`: uint16 outputs can only be bf16; write \"bf16\""),
            ));
        }
        Ok(file)
    }
}

/// An output read and converted to f64, with the format it was stored in.
#[derive(Debug, Clone)]
pub struct Output {
    pub values: Vec<f64>,
    pub format: OutputFormat,
    pub path: PathBuf,
}

/// Why an output cannot be graded: each is a FAIL of that problem, never a crash.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OutputFault {
    #[error("{path}: missing{}", note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default())]
    Missing { path: PathBuf, note: Option<String> },
    #[error("{0}")]
    Unreadable(String),
    #[error("{path}: shape {got:?}, expected [B, Hq, Sq, D] = {expected:?}")]
    Misshaped {
        path: PathBuf,
        got: Vec<usize>,
        expected: [usize; 4],
    },
    #[error("{path}: {message}")]
    WrongType { path: PathBuf, message: String },
}

/// Reads `OUT/<id>.npy` as an output of `expected` shape; `facts` and `u16_is_bf16` say what
/// the file alone cannot.
pub fn read_output(
    out: &Path,
    id: &str,
    expected: [usize; 4],
    facts: Option<&ProblemFacts>,
    u16_is_bf16: bool,
) -> Result<Output, OutputFault> {
    let path = out.join(format!("{id}.npy"));
    if path.is_dir() {
        return Err(OutputFault::Unreadable(format!(
            "{}: a folder, not a .npy file; write the output there as a file",
            path.display()
        )));
    }
    if !path.is_file() && path.symlink_metadata().is_ok() {
        return Err(OutputFault::Unreadable(format!(
            "{}: not a regular file (a pipe, a device, or a link to nothing); write the output \
             there as a file",
            path.display()
        )));
    }
    if !path.is_file() {
        return Err(OutputFault::Missing {
            path,
            note: facts.and_then(|f| f.note.clone()),
        });
    }
    // Before reading: no output of this shape, in any dtype (at most 8 bytes an element, f64)
    // with any header (at most 64 KiB + 12), is longer than this; a longer file is not read
    // into memory.
    let most = expected.iter().product::<usize>() as u64 * Dtype::F64.size() as u64 + 65_548;
    let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    if len > most {
        return Err(OutputFault::Unreadable(format!(
            "{}: {len} bytes, more than any output of shape {expected:?} holds ({most} at \
             most); write the [B, Hq, Sq, D] output alone",
            path.display()
        )));
    }
    let array = npy::read(&path).map_err(|e| OutputFault::Unreadable(e.to_string()))?;
    if array.shape != expected {
        return Err(OutputFault::Misshaped {
            path,
            got: array.shape,
            expected,
        });
    }
    let wrong = |message: String| OutputFault::WrongType {
        path: path.clone(),
        message,
    };
    let words = |n: usize| array.data.chunks_exact(n);
    let (values, format): (Vec<f64>, OutputFormat) = match array.dtype {
        Dtype::F16 => (
            words(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f64())
                .collect(),
            OutputFormat::F16,
        ),
        Dtype::F32 => (
            words(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
                .collect(),
            OutputFormat::F32,
        ),
        Dtype::F64 => (
            words(8)
                .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
            // Graded as if rounded to f32: a wider output only errs less.
            OutputFormat::F32,
        ),
        Dtype::U16 if u16_is_bf16 => (
            words(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f64())
                .collect(),
            OutputFormat::Bf16,
        ),
        Dtype::U16 => {
            return Err(wrong(
                "uint16 without a meaning: if it holds bf16, say so with \"u16\": \"bf16\" in \
                 implementation.json (or check --u16-is-bf16)"
                    .into(),
            ));
        }
        Dtype::U8 => {
            let scale = facts.and_then(|f| f.o_scale).ok_or_else(|| {
                wrong(format!(
                    "uint8 (e4m3 codes) needs the output's scale: give problems.{id}.o_scale in \
                     implementation.json"
                ))
            })?;
            if !(scale.is_finite() && scale > 0.0) {
                return Err(wrong(format!("o_scale {scale} is not a positive number")));
            }
            (
                array
                    .data
                    .iter()
                    .map(|&c| crate::fp8::decode(c) as f64 * scale)
                    .collect(),
                OutputFormat::E4m3 { scale },
            )
        }
    };
    Ok(Output {
        values,
        format,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, id: &str, bytes: Vec<u8>) {
        std::fs::write(dir.join(format!("{id}.npy")), bytes).unwrap();
    }

    #[test]
    fn a_float64_output_of_a_real_size_is_read_not_refused_as_too_long() {
        let dir = tempfile::tempdir().unwrap();
        let shape = [1, 2, 512, 64];
        let n: usize = shape.iter().product();
        let bytes: Vec<u8> = (0..n)
            .flat_map(|i| (i as f64 / 1e3).to_le_bytes())
            .collect();
        write(dir.path(), "d", npy::encode(Dtype::F64, &shape, &bytes));
        let out = read_output(dir.path(), "d", shape, None, false).unwrap();
        assert_eq!(out.values.len(), n);
        assert_eq!(out.values[n - 1], (n - 1) as f64 / 1e3);
    }

    #[test]
    fn each_output_type_reads_as_its_values_and_format() {
        let dir = tempfile::tempdir().unwrap();
        let shape = [1, 1, 1, 2];
        let f16s: Vec<u8> = [0.5f32, -1.25]
            .iter()
            .flat_map(|&x| f16::from_f32(x).to_le_bytes())
            .collect();
        write(dir.path(), "h", npy::encode(Dtype::F16, &shape, &f16s));
        let bfs: Vec<u8> = [0.5f32, -1.25]
            .iter()
            .flat_map(|&x| bf16::from_f32(x).to_le_bytes())
            .collect();
        write(dir.path(), "b", npy::encode(Dtype::U16, &shape, &bfs));
        let codes = [crate::fp8::encode(0.5), crate::fp8::encode(-1.25)];
        write(dir.path(), "e", npy::encode(Dtype::U8, &shape, &codes));
        let h = read_output(dir.path(), "h", shape, None, false).unwrap();
        assert_eq!((h.values, h.format), (vec![0.5, -1.25], OutputFormat::F16));
        let b = read_output(dir.path(), "b", shape, None, true).unwrap();
        assert_eq!((b.values, b.format), (vec![0.5, -1.25], OutputFormat::Bf16));
        let facts = ProblemFacts {
            o_scale: Some(0.5),
            ..Default::default()
        };
        let e = read_output(dir.path(), "e", shape, Some(&facts), false).unwrap();
        assert_eq!(e.values, vec![0.25, -0.625]);
        assert_eq!(e.format, OutputFormat::E4m3 { scale: 0.5 });
    }

    #[test]
    fn a_missing_misshaped_folder_or_unexplained_output_is_a_fault_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "m", npy::encode_f32(&[1, 1, 2, 1], &[0.0, 1.0]));
        write(
            dir.path(),
            "u",
            npy::encode(Dtype::U16, &[1, 1, 1, 2], &[0; 4]),
        );
        write(dir.path(), "c", npy::encode(Dtype::U8, &[1, 1, 1, 1], &[0]));
        // A valid header of the right shape followed by far more bytes than it promises.
        let mut long = npy::encode_f32(&[1, 1, 1, 2], &[0.0, 1.0]);
        long.resize(long.len() + 200_000, 0);
        write(dir.path(), "big", long);
        std::fs::write(dir.path().join("x.npy"), b"junk").unwrap();
        std::fs::create_dir(dir.path().join("f.npy")).unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(dir.path().join("nowhere"), dir.path().join("l.npy")).unwrap();
        let shape = [1, 1, 1, 2];
        let cases = [
            ("gone", "missing"),
            ("f", "a folder, not a .npy file"),
            ("big", "more than any output of shape [1, 1, 1, 2] holds"),
            #[cfg(unix)]
            ("l", "not a regular file"),
            ("m", "shape [1, 1, 2, 1]"),
            ("u", "uint16 without a meaning"),
            ("x", "not a .npy file"),
        ];
        for (id, needle) in cases {
            let err = read_output(dir.path(), id, shape, None, false)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("{id}.npy")) && err.contains(needle),
                "{err}"
            );
        }
        let err = read_output(dir.path(), "c", [1, 1, 1, 1], None, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("o_scale"), "{err}");
    }

    #[test]
    fn an_implementation_file_with_an_unknown_key_or_u16_meaning_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ImplementationFile::load(dir.path()).unwrap().name.is_none());
        let path = dir.path().join(IMPLEMENTATION_FILE);
        std::fs::write(&path, r#"{"name": "x", "precison": "fp8"}"#).unwrap();
        let err = ImplementationFile::load(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("precison"), "{err}");
        std::fs::write(&path, r#"{"u16": "f16"}"#).unwrap();
        let err = ImplementationFile::load(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("bf16"), "{err}");
        std::fs::write(
            &path,
            r#"{"precision": "fp8", "problems": {"a": {"o_scale": 0.1}}}"#,
        )
        .unwrap();
        let f = ImplementationFile::load(dir.path()).unwrap();
        assert_eq!(f.precision, Some(Precision::Fp8));
    }
}
