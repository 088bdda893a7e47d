//! Problems handed to other implementations and their outputs read back (docs/DESIGN.md
//! "Grading other implementations"): `export` writes a folder any framework reads (a
//! manifest and NumPy files), `check` reads the outputs an implementation wrote for it.

pub mod npy;
mod outputs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use outputs::{IMPLEMENTATION_FILE, ImplementationFile, Output, OutputFault, read_output};

use crate::problem::Problem;
use crate::shapes::{Dist, Shape};
use crate::usage::ConfigError;

/// The manifest's file name inside an export folder.
pub const MANIFEST: &str = "manifest.json";
/// The manifest's `format`: bumped when its meaning changes.
pub const FORMAT: &str = "sdpa-runner export v1";

/// `DIR/manifest.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    /// Layouts and conventions, for a reader who has only this file.
    #[serde(default)]
    pub conventions: BTreeMap<String, String>,
    pub problems: Vec<ExportedProblem>,
}

/// One problem of an export: its description, its seed, its inputs' checksum and its files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportedProblem {
    /// Unique in the export; the implementation writes its output to `<id>.npy`.
    pub id: String,
    /// The shape's name in the shapes file, or its inline spelling.
    pub shape: String,
    #[serde(rename = "B")]
    pub b: usize,
    #[serde(rename = "Hq")]
    pub hq: usize,
    #[serde(rename = "Hkv")]
    pub hkv: usize,
    #[serde(rename = "Sq")]
    pub sq: usize,
    #[serde(rename = "Sk")]
    pub sk: usize,
    #[serde(rename = "D")]
    pub d: usize,
    /// Bottom-right aligned: query i sees keys j <= i + Sk - Sq.
    pub causal: bool,
    pub softmax_scale: f32,
    pub distribution: Dist,
    /// Q and K rotated along D by the normalized Hadamard matrix before quantization
    /// ([`Shape::rotate`]): q and k files hold the rotated tensors; V and the output are as
    /// without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rotate: bool,
    pub qk_std: f64,
    pub seed: u64,
    /// sha256 of the f32 inputs, as the runner's records give it.
    pub checksum: String,
    /// `q`, `k`, `v`, `q_fp8`, ..., `v_scale` -> path relative to the export folder.
    pub files: BTreeMap<String, String>,
}

impl ExportedProblem {
    pub fn describe(id: String, p: &Problem, files: BTreeMap<String, String>) -> Self {
        let sh = &p.shape;
        ExportedProblem {
            id,
            shape: sh.name.clone(),
            b: sh.b,
            hq: sh.h,
            hkv: sh.hkv,
            sq: sh.s,
            sk: sh.sk,
            d: sh.d,
            causal: sh.causal,
            softmax_scale: p.softmax_scale,
            distribution: sh.dist,
            rotate: sh.rotate,
            qk_std: sh.qk_std,
            seed: p.seed,
            checksum: p.inputs.checksum.clone(),
            files,
        }
    }

    /// The problem's shape, checked as the runner checks every shape.
    pub fn to_shape(&self) -> Result<Shape, String> {
        let shape = Shape {
            hkv: self.hkv,
            sk: self.sk,
            causal: self.causal,
            qk_std: self.qk_std,
            dist: self.distribution,
            rotate: self.rotate,
            ..Shape::new(&self.shape, self.b, self.hq, self.sq, self.d)
        };
        shape.validate()?;
        if !(crate::shapes::QK_STD_MIN..=crate::shapes::QK_STD_MAX).contains(&self.qk_std) {
            return Err(format!("qk_std {} is out of range", self.qk_std));
        }
        if self.softmax_scale != shape.softmax_scale() {
            return Err(format!(
                "softmax_scale {} is not 1/sqrt(D) = {}; the runner's problems use 1/sqrt(D)",
                self.softmax_scale,
                shape.softmax_scale()
            ));
        }
        Ok(shape)
    }

    /// `[B, Hq, Sq, D]`: the output's shape.
    pub fn output_shape(&self) -> [usize; 4] {
        [self.b, self.hq, self.sq, self.d]
    }
}

/// The id of the `n`th problem: the shape's name made a file name, and the seed.
pub fn problem_id(shape: &Shape, seed: u64) -> String {
    let name: String = shape
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{name}-seed{seed}")
}

/// The manifest's conventions, stated once for every reader.
pub fn conventions() -> BTreeMap<String, String> {
    [
        ("layout", "q [B, Hq, Sq, D]; k, v [B, Hkv, Sk, D]; C order, little-endian"),
        ("gqa", "query head h reads K/V head h / (Hq / Hkv)"),
        ("causal", "bottom-right: query i sees keys j <= i + Sk - Sq; a row that sees no key is all zeros"),
        ("rotate", "where a problem says rotate: true, q and k (and their codes) are the drawn tensors times the normalized Hadamard matrix H along D (Sylvester order); QH(KH)^T = QK^T, so the expected output is the attention of the drawn inputs"),
        ("fp8", "e4m3 (OCP, saturating to +-448) codes as uint8; value = decode(code) * scale, one scale per (b, head): q_scale [B, Hq], k_scale and v_scale [B, Hkv]"),
        ("output", "write OUT/<id>.npy, shape [B, Hq, Sq, D]: float16, float32, bfloat16 as uint16 (say so in OUT/implementation.json), or e4m3 codes as uint8 with the output's scale in OUT/implementation.json"),
        ("softmax", "O = softmax(softmax_scale * Q K^T + mask) V"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Reads and checks `DIR/manifest.json`: every problem a valid shape, ids unique and safe
/// as file names.
pub fn load_manifest(dir: &Path) -> Result<Manifest, ConfigError> {
    let path = dir.join(MANIFEST);
    let Some(text) = crate::json::read_found_text_if_any(&path)? else {
        return Err(ConfigError::Usage(format!(
            "{} has no {MANIFEST}: pass a folder written by `sdpa-runner export`",
            dir.display()
        )));
    };
    let manifest: Manifest = crate::json::from_str_with_path(&path, &text)?;
    if manifest.format != FORMAT {
        return Err(ConfigError::invalid_key(
            &path,
            "format",
            format!(
                "`{}` is not `{FORMAT}`; export the problems again with this sdpa-runner",
                manifest.format
            ),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, p) in manifest.problems.iter().enumerate() {
        let key = format!("problems[{i}]");
        if p.id.is_empty()
            || p.id.starts_with('.')
            || !p
                .id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(ConfigError::invalid_key(
                &path,
                format!("{key}.id"),
                format!(
                    "`{}` is not a file name of letters, digits, -, _ and .",
                    p.id
                ),
            ));
        }
        if !seen.insert(p.id.clone()) {
            return Err(ConfigError::invalid_key(
                &path,
                format!("{key}.id"),
                format!("`{}` appears twice", p.id),
            ));
        }
        p.to_shape()
            .map_err(|m| ConfigError::invalid_key(&path, key.clone(), m))?;
        for (name, rel) in &p.files {
            if !FILE_NAMES.contains(&name.as_str()) {
                return Err(ConfigError::invalid_key(
                    &path,
                    format!("{key}.files.{name}"),
                    format!("is not one of {}", FILE_NAMES.join(", ")),
                ));
            }
            let inside = Path::new(rel)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if rel.is_empty() || !inside {
                return Err(ConfigError::invalid_key(
                    &path,
                    format!("{key}.files.{name}"),
                    format!("`{rel}` is not a path inside the export folder"),
                ));
            }
        }
    }
    if manifest.problems.is_empty() {
        return Err(ConfigError::invalid_key(&path, "problems", "is empty"));
    }
    Ok(manifest)
}

/// The names of a problem's files, as `files` in the manifest keys them.
pub const FILE_NAMES: [&str; 9] = [
    "q", "k", "v", "q_fp8", "k_fp8", "v_fp8", "q_scale", "k_scale", "v_scale",
];

/// The files of one problem, written into `dir/<id>/`: name -> (relative path, bytes).
pub fn problem_files(id: &str, p: &Problem) -> Vec<(String, PathBuf, Vec<u8>)> {
    let sh = &p.shape;
    let q_shape = [sh.b, sh.h, sh.s, sh.d];
    let kv_shape = [sh.b, sh.hkv, sh.sk, sh.d];
    let (q_scales, kv_scales) = ([sh.b, sh.h], [sh.b, sh.hkv]);
    let codes =
        |shape: &[usize], t: &crate::fp8::Fp8Tensor| npy::encode(npy::Dtype::U8, shape, &t.codes);
    let scales = |shape: &[usize], t: &crate::fp8::Fp8Tensor| npy::encode_f32(shape, &t.scales);
    let files = [
        ("q", npy::encode_f32(&q_shape, &p.inputs.q)),
        ("k", npy::encode_f32(&kv_shape, &p.inputs.k)),
        ("v", npy::encode_f32(&kv_shape, &p.inputs.v)),
        ("q_fp8", codes(&q_shape, &p.q)),
        ("k_fp8", codes(&kv_shape, &p.k)),
        ("v_fp8", codes(&kv_shape, &p.v)),
        ("q_scale", scales(&q_scales, &p.q)),
        ("k_scale", scales(&kv_scales, &p.k)),
        ("v_scale", scales(&kv_scales, &p.v)),
    ];
    files
        .into_iter()
        .map(|(name, bytes)| {
            (
                name.to_string(),
                Path::new(id).join(format!("{name}.npy")),
                bytes,
            )
        })
        .collect()
}

/// Checks that every file of an exported problem holds what export wrote for `p` (the problem
/// drawn again): the inputs an implementation read are the inputs graded against. A file
/// missing from the manifest or the folder, unreadable, or with other bytes is named.
pub fn verify_files(dir: &Path, e: &ExportedProblem, p: &Problem) -> Result<(), String> {
    for (name, _, bytes) in problem_files(&e.id, p) {
        let Some(rel) = e.files.get(&name) else {
            return Err(format!(
                "problem {}: the manifest names no `{name}` file",
                e.id
            ));
        };
        let path = dir.join(rel);
        let cannot =
            |why: String| format!("problem {}: cannot read {}: {why}", e.id, path.display());
        let meta = std::fs::metadata(&path).map_err(|err| cannot(err.to_string()))?;
        if !meta.is_file() {
            return Err(cannot("not a regular file".into()));
        }
        if meta.len() != bytes.len() as u64 {
            return Err(format!(
                "problem {}: {} is not what export wrote ({} bytes, export wrote {})",
                e.id,
                path.display(),
                meta.len(),
                bytes.len()
            ));
        }
        let on_disk = std::fs::read(&path).map_err(|err| cannot(err.to_string()))?;
        if on_disk != bytes {
            return Err(format!(
                "problem {}: {} is not what export wrote ({} bytes, export wrote {}; first \
                 difference at byte {}): an implementation reading it was given other inputs \
                 than those graded",
                e.id,
                path.display(),
                on_disk.len(),
                bytes.len(),
                on_disk
                    .iter()
                    .zip(&bytes)
                    .position(|(a, b)| a != b)
                    .unwrap_or(on_disk.len().min(bytes.len()))
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_file_names_that_keep_the_shape_and_seed() {
        let sh = Shape::parse_inline("1x32x512x128:sk=4096:hkv=8:causal")
            .unwrap()
            .unwrap();
        assert_eq!(
            problem_id(&sh, 3),
            "1x32x512x128_sk_4096_hkv_8_causal-seed3"
        );
        assert_eq!(
            problem_id(&Shape::new("small", 1, 1, 32, 64), 0),
            "small-seed0"
        );
    }

    #[test]
    fn a_problem_describes_itself_and_reads_back_to_the_same_shape() {
        let sh = Shape::parse_inline("1x4x33x64:sk=70:hkv=2:causal")
            .unwrap()
            .unwrap();
        let p = Problem::new(&sh, 1);
        let e = ExportedProblem::describe("x".into(), &p, BTreeMap::new());
        assert_eq!((e.hq, e.hkv, e.sq, e.sk, e.causal), (4, 2, 33, 70, true));
        let json = serde_json::to_string(&e).unwrap();
        for key in ["\"B\"", "\"Hq\"", "\"Hkv\"", "\"Sq\"", "\"Sk\"", "\"D\""] {
            assert!(json.contains(key), "{json}");
        }
        let back: ExportedProblem = serde_json::from_str(&json).unwrap();
        assert_eq!(back.to_shape().unwrap(), sh);
    }

    #[test]
    fn a_problem_the_runner_cannot_hold_is_refused_with_the_rule() {
        let p = Problem::new(&Shape::new("t", 1, 2, 8, 64), 0);
        let mut e = ExportedProblem::describe("t".into(), &p, BTreeMap::new());
        e.hkv = 3;
        assert!(e.to_shape().unwrap_err().contains("multiple of Hkv"));
        e.hkv = 2;
        e.softmax_scale = 0.5;
        assert!(e.to_shape().unwrap_err().contains("softmax_scale"));
    }

    #[test]
    fn the_files_hold_every_tensor_in_its_layout() {
        let sh = Shape::parse_inline("2x4x5x64:sk=7:hkv=2").unwrap().unwrap();
        let p = Problem::new(&sh, 0);
        let files = problem_files("a", &p);
        let shapes: BTreeMap<String, Vec<usize>> = files
            .iter()
            .map(|(n, path, bytes)| (n.clone(), npy::decode(path, bytes).unwrap().shape))
            .collect();
        assert_eq!(shapes["q"], [2, 4, 5, 64]);
        assert_eq!(shapes["k_fp8"], [2, 2, 7, 64]);
        assert_eq!(shapes["q_scale"], [2, 4]);
        assert_eq!(shapes["v_scale"], [2, 2]);
        assert_eq!(files.len(), 9);
        assert!(
            files
                .iter()
                .all(|(n, path, _)| path == &Path::new("a").join(format!("{n}.npy")))
        );
    }

    #[test]
    fn exported_files_verify_and_a_changed_or_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let sh = Shape::parse_inline("1x2x5x64:sk=7:hkv=1").unwrap().unwrap();
        let p = Problem::new(&sh, 0);
        let files = problem_files("a", &p);
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        let mut map = BTreeMap::new();
        for (name, rel, bytes) in &files {
            std::fs::write(dir.path().join(rel), bytes).unwrap();
            map.insert(name.clone(), rel.display().to_string());
        }
        let e = ExportedProblem::describe("a".into(), &p, map);
        verify_files(dir.path(), &e, &p).unwrap();

        // One e4m3 code changed: named, with the byte.
        let k_fp8 = dir.path().join("a/k_fp8.npy");
        let mut bytes = std::fs::read(&k_fp8).unwrap();
        let at = bytes.len() - 3;
        bytes[at] ^= 1;
        std::fs::write(&k_fp8, &bytes).unwrap();
        let err = verify_files(dir.path(), &e, &p).unwrap_err();
        assert!(
            err.contains("k_fp8.npy is not what export wrote")
                && err.contains(&format!("byte {at}")),
            "{err}"
        );
        // A problem drawn from another seed does not match the files either.
        std::fs::write(&k_fp8, &files[4].2).unwrap();
        verify_files(dir.path(), &e, &p).unwrap();
        assert!(verify_files(dir.path(), &e, &Problem::new(&sh, 1)).is_err());
        // A missing scale file is named.
        std::fs::remove_file(dir.path().join("a/v_scale.npy")).unwrap();
        let err = verify_files(dir.path(), &e, &p).unwrap_err();
        assert!(
            err.contains("cannot read") && err.contains("v_scale.npy"),
            "{err}"
        );
    }

    #[test]
    fn a_manifest_naming_paths_outside_its_folder_unknown_files_or_keys_or_trailing_text_is_refused()
     {
        let dir = tempfile::tempdir().unwrap();
        let sh = Shape::new("small", 1, 1, 8, 64);
        let p = Problem::new(&sh, 0);
        let files: BTreeMap<String, String> = problem_files("a", &p)
            .into_iter()
            .map(|(n, rel, _)| (n, rel.display().to_string()))
            .collect();
        let good = serde_json::json!({
            "format": FORMAT,
            "problems": [ExportedProblem::describe("a".into(), &p, files)],
        });
        let write = |v: &serde_json::Value, tail: &str| {
            std::fs::write(dir.path().join(MANIFEST), format!("{v}{tail}")).unwrap();
        };
        write(&good, "\n");
        load_manifest(dir.path()).unwrap();
        let edited = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v = good.clone();
            f(&mut v);
            v
        };
        for (v, tail, key) in [
            (
                edited(&|v| v["problems"][0]["files"]["q"] = "../../etc/passwd".into()),
                "",
                "problems[0].files.q",
            ),
            (
                edited(&|v| v["problems"][0]["files"]["k"] = "/dev/zero".into()),
                "",
                "problems[0].files.k",
            ),
            (
                edited(&|v| v["problems"][0]["files"]["evil"] = "a/x.npy".into()),
                "",
                "problems[0].files.evil",
            ),
            (edited(&|v| v["problems"][0]["zzz"] = 1.into()), "", "zzz"),
            (edited(&|v| v["extra"] = 1.into()), "", "extra"),
            (good.clone(), " trailing", "malformed JSON"),
        ] {
            write(&v, tail);
            let err = load_manifest(dir.path()).unwrap_err().to_string();
            assert!(err.contains(key), "{key}: {err}");
        }
    }

    #[test]
    fn a_file_that_is_not_a_regular_file_is_refused_without_reading_it() {
        let dir = tempfile::tempdir().unwrap();
        let sh = Shape::new("small", 1, 1, 8, 64);
        let p = Problem::new(&sh, 0);
        let mut map = BTreeMap::new();
        for (name, rel, bytes) in problem_files("a", &p) {
            std::fs::create_dir_all(dir.path().join("a")).unwrap();
            std::fs::write(dir.path().join(&rel), bytes).unwrap();
            map.insert(name, rel.display().to_string());
        }
        let e = ExportedProblem::describe("a".into(), &p, map);
        #[cfg(unix)]
        {
            let q = dir.path().join("a/q.npy");
            std::fs::remove_file(&q).unwrap();
            std::os::unix::fs::symlink("/dev/zero", &q).unwrap();
            let err = verify_files(dir.path(), &e, &p).unwrap_err();
            assert!(err.contains("not a regular file"), "{err}");
        }
    }
}
