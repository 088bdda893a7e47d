//! Named problem shapes: the shapes file, inline `BxHxSxD` shapes, and the checks that refuse
//! what the kernel cannot run (S = 0, D other than 64) before any work starts.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::usage::ConfigError;

/// The allowed spread of Q and K: the range the checks were proven over. Inputs are drawn in
/// f32 and scores computed in f32; at qk_std 100 a score reaches about 100² · 6² · 64 / 8 ≈
/// 3e6, far inside f32 and already a one-hot softmax; at 1e-3 the softmax is uniform to f16's
/// resolution. Beyond them nothing new is tested, and far beyond, f32 overflows.
pub const QK_STD_MIN: f64 = 1e-3;
pub const QK_STD_MAX: f64 = 100.0;

/// The only head dimension the Stage-C kernel supports (its HEAD_DIM).
pub const HEAD_DIM: usize = 64;

/// One attention problem size, `[B, H, S, D]`, plus how its inputs are drawn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    pub name: String,
    #[serde(rename = "B")]
    pub b: usize,
    #[serde(rename = "H")]
    pub h: usize,
    #[serde(rename = "S")]
    pub s: usize,
    #[serde(rename = "D")]
    pub d: usize,
    /// Standard deviation of Q and K (V is always standard normal). Above 1 it widens the
    /// score range, so the online-softmax rescale across KV tiles carries real weight.
    #[serde(default = "unit_std", skip_serializing_if = "is_unit_std")]
    pub qk_std: f64,
    /// What the shape is for, shown by `sdpa-runner shapes`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub purpose: String,
    /// How the inputs are drawn beyond the normal draws ([`Dist`]).
    #[serde(default, skip_serializing_if = "Dist::is_normal")]
    pub dist: Dist,
}

/// Input distributions: standard normal draws (Q, K times `qk_std`), then a change that
/// stresses one part of the kernel. `sdpa-runner fuzz` draws all of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Dist {
    /// Normal draws only.
    #[default]
    Normal,
    /// Eight elements of each (b, h) slice of Q, K and V times 30: the scales follow the
    /// outliers, so every other value lands low in E4M3's range or among its subnormals.
    Outliers,
    /// Every fourth key equal to key 0 and every fourth value row constant: ties in the
    /// scores and rows that P·V must reproduce exactly.
    ConstantRows,
    /// One key per head aligned with a direction added to every query: one score far above
    /// the rest, so the softmax is one-hot.
    Spike,
    /// Each (b, h) slice of Q, K and V scaled by its own factor in [1/30, 30]: per-head scales
    /// that differ by orders of magnitude.
    HeadScale,
}

impl Dist {
    pub const ALL: [Dist; 5] = [
        Dist::Normal,
        Dist::Outliers,
        Dist::ConstantRows,
        Dist::Spike,
        Dist::HeadScale,
    ];

    pub fn is_normal(&self) -> bool {
        *self == Dist::Normal
    }

    pub fn name(&self) -> &'static str {
        match self {
            Dist::Normal => "normal",
            Dist::Outliers => "outliers",
            Dist::ConstantRows => "constant_rows",
            Dist::Spike => "spike",
            Dist::HeadScale => "head_scale",
        }
    }

    fn parse(text: &str) -> Option<Dist> {
        Dist::ALL.into_iter().find(|d| d.name() == text)
    }
}

fn unit_std() -> f64 {
    1.0
}
fn is_unit_std(x: &f64) -> bool {
    *x == 1.0
}

impl Shape {
    /// Elements in one of Q, K, V or O; `None` if the count overflows.
    pub fn elements(&self) -> Option<usize> {
        self.b
            .checked_mul(self.h)?
            .checked_mul(self.s)?
            .checked_mul(self.d)
    }

    /// Number of (batch, head) pairs: one FP8 scale each, one grid row each on the GPU.
    pub fn heads(&self) -> usize {
        self.b * self.h
    }

    pub fn dims(&self) -> String {
        format!("{}x{}x{}x{}", self.b, self.h, self.s, self.d)
    }

    /// The default softmax scale, 1/sqrt(D).
    pub fn softmax_scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }

    /// Checks what the kernel and the runner can handle; the message names the offending field.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-:=.".contains(c))
        {
            return Err(format!(
                "name `{}` must be non-empty letters, digits, '_', '-' (and ':', '=', '.' as \
                 inline shapes write them)",
                self.name
            ));
        }
        for (key, value) in [("B", self.b), ("H", self.h)] {
            if value == 0 {
                return Err(format!("{key}=0: {key} must be at least 1"));
            }
        }
        if self.s == 0 {
            return Err("S=0: the sequence length must be at least 1".into());
        }
        if self.s > i32::MAX as usize {
            return Err(format!(
                "S={}: the kernel takes S as a 32-bit int; the most is {}",
                self.s,
                i32::MAX
            ));
        }
        if self.d != HEAD_DIM {
            return Err(format!(
                "D={}: the Stage-C kernel supports D={HEAD_DIM} only (its HEAD_DIM)",
                self.d
            ));
        }
        if !(self.qk_std.is_finite() && (QK_STD_MIN..=QK_STD_MAX).contains(&self.qk_std)) {
            return Err(format!(
                "qk_std={} is out of range: allowed {QK_STD_MIN} to {QK_STD_MAX} (beyond them \
                 the f32 inputs or their scores leave the range the kernel computes in)",
                self.qk_std
            ));
        }
        if self.elements().is_none() {
            return Err("B*H*S*D overflows".into());
        }
        Ok(())
    }

    /// Host bytes one (shape, seed) needs at its peak when `checked_rows` rows per head are
    /// held to the references by `threads` workers: per element the inputs (f32) and codes,
    /// three f16 outputs (stress keeps a first output beside two concurrent ones); per checked
    /// element the two references and their bounds (f64) and the emulation (f16) with a copy; per worker one head's f64 operands (K, V, |V| of
    /// the codes, K, V of the inputs) and its two 64-row score blocks.
    pub fn host_bytes_needed(&self, checked_rows: usize, threads: usize) -> Option<u64> {
        const PER_ELEMENT: u64 = 3 * 4 + 3 + 3 * 2;
        const PER_CHECKED: u64 = 4 * 8 + 2 + 2;
        let n = self.elements()? as u64;
        let checked = (self.heads() as u64)
            .checked_mul(checked_rows.min(self.s) as u64)?
            .checked_mul(self.d as u64)?;
        let per_worker = (self.s as u64).checked_mul(5 * self.d as u64 * 8 + 2 * 64 * 8)?;
        n.checked_mul(PER_ELEMENT)?
            .checked_add(checked.checked_mul(PER_CHECKED)?)?
            .checked_add(per_worker.checked_mul(threads as u64)?)
    }

    /// The inline spelling of this shape, `BxHxSxD[:qk=F][:dist=NAME]`, which
    /// [`Shape::parse_inline`] reads back to the same problem (a one-line reproduction).
    pub fn inline(&self) -> String {
        let mut t = self.dims();
        if self.qk_std != 1.0 {
            t.push_str(&format!(":qk={}", self.qk_std));
        }
        if !self.dist.is_normal() {
            t.push_str(&format!(":dist={}", self.dist.name()));
        }
        t
    }

    /// Parses an inline `BxHxSxD[:qk=F][:dist=NAME]` shape; `None` if `text` does not start
    /// with `BxHxSxD`.
    pub fn parse_inline(text: &str) -> Option<Result<Shape, ConfigError>> {
        let mut options = text.split(':');
        let dims_text = options.next().unwrap_or_default();
        let parts: Vec<&str> = dims_text.split(['x', 'X']).collect();
        if parts.len() != 4
            || parts
                .iter()
                .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return None;
        }
        let mut dims = [0usize; 4];
        for (slot, part) in dims.iter_mut().zip(&parts) {
            match part.parse() {
                Ok(v) => *slot = v,
                Err(_) => {
                    return Some(Err(ConfigError::BadShape {
                        name: text.into(),
                        message: format!("`{part}` is too large"),
                    }));
                }
            }
        }
        let mut shape = Shape {
            name: text.to_ascii_lowercase(),
            b: dims[0],
            h: dims[1],
            s: dims[2],
            d: dims[3],
            qk_std: 1.0,
            purpose: String::new(),
            dist: Default::default(),
        };
        let bad = |message: String| {
            Some(Err(ConfigError::BadShape {
                name: text.into(),
                message,
            }))
        };
        for option in options {
            match option.split_once('=') {
                Some(("qk", v)) => match v.parse::<f64>() {
                    Ok(x) => shape.qk_std = x,
                    Err(_) => return bad(format!("qk=`{v}` is not a number")),
                },
                Some(("dist", v)) => match Dist::parse(v) {
                    Some(d) => shape.dist = d,
                    None => {
                        let known: Vec<&str> = Dist::ALL.iter().map(Dist::name).collect();
                        return bad(format!(
                            "dist=`{v}` is unknown; known: {}",
                            known.join(", ")
                        ));
                    }
                },
                _ => {
                    return bad(format!(
                        "`{option}` is not an option; write BxHxSxD[:qk=F][:dist=NAME]"
                    ));
                }
            }
        }
        Some(
            shape
                .validate()
                .map(|_| shape.clone())
                .map_err(|message| ConfigError::BadShape {
                    name: text.into(),
                    message,
                }),
        )
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShapeFile {
    version: u32,
    shapes: Vec<Shape>,
    /// Shapes run only when named: too heavy for `all` (long contexts, tens of GiB).
    #[serde(default)]
    by_name: Vec<Shape>,
}

/// The shapes of one shapes file, validated.
#[derive(Debug, Clone)]
pub struct ShapeCatalog {
    path: PathBuf,
    /// `shapes`, then `by_name`.
    shapes: Vec<Shape>,
    /// How many of them `all` selects (the `shapes` list).
    in_all: usize,
}

impl ShapeCatalog {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(path, &crate::json::read_text(path)?)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let file: ShapeFile = crate::json::from_str_with_path(path, text)?;
        if file.version != 1 {
            return Err(ConfigError::invalid_key(
                path,
                "version",
                format!(
                    "version {} is not supported; this runner reads version 1",
                    file.version
                ),
            ));
        }
        if file.shapes.is_empty() {
            return Err(ConfigError::invalid_key(
                path,
                "shapes",
                "the list is empty",
            ));
        }
        let in_all = file.shapes.len();
        let shapes: Vec<Shape> = file.shapes.into_iter().chain(file.by_name).collect();
        let key = |i: usize| {
            if i < in_all {
                format!("shapes[{i}]")
            } else {
                format!("by_name[{}]", i - in_all)
            }
        };
        for (i, shape) in shapes.iter().enumerate() {
            shape.validate().map_err(|m| {
                ConfigError::invalid_key(path, format!("{} ({})", key(i), shape.name), m)
            })?;
            if Shape::parse_inline(&shape.name).is_some() {
                return Err(ConfigError::invalid_key(
                    path,
                    format!("{}.name", key(i)),
                    format!(
                        "`{}` looks like an inline BxHxSxD shape; pick another name",
                        shape.name
                    ),
                ));
            }
            if shapes[..i].iter().any(|other| other.name == shape.name) {
                return Err(ConfigError::invalid_key(
                    path,
                    format!("{}.name", key(i)),
                    format!("`{}` is defined twice", shape.name),
                ));
            }
        }
        Ok(ShapeCatalog {
            path: path.to_path_buf(),
            shapes,
            in_all,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every shape of the file, those `all` selects first.
    pub fn shapes(&self) -> &[Shape] {
        &self.shapes
    }

    /// Whether `all` selects this shape (false for the file's `by_name` list).
    pub fn in_all(&self, name: &str) -> bool {
        self.shapes[..self.in_all].iter().any(|s| s.name == name)
    }

    pub fn get(&self, name: &str) -> Option<&Shape> {
        self.shapes.iter().find(|s| s.name == name)
    }

    /// Resolves `--shapes`: comma-separated names from this catalog or inline `BxHxSxD`
    /// shapes; `all` selects every shape of the file's `shapes` list (not its `by_name` list).
    /// Duplicates are dropped.
    pub fn select(&self, spec: &str) -> Result<Vec<Shape>, ConfigError> {
        let mut selected: Vec<Shape> = Vec::new();
        for item in spec.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(ConfigError::Usage(format!(
                    "--shapes `{spec}` has an empty item; write names separated by commas, e.g. small,mission"
                )));
            }
            let found: Vec<Shape> = if item == "all" {
                self.shapes[..self.in_all].to_vec()
            } else if let Some(shape) = self.get(item) {
                vec![shape.clone()]
            } else if let Some(inline) = Shape::parse_inline(item) {
                vec![inline?]
            } else {
                return Err(ConfigError::UnknownShape {
                    name: item.into(),
                    path: self.path.clone(),
                    known: self.names().join(", "),
                });
            };
            for shape in found {
                if !selected.iter().any(|s| s.name == shape.name) {
                    selected.push(shape);
                }
            }
        }
        Ok(selected)
    }

    pub fn names(&self) -> Vec<&str> {
        self.shapes.iter().map(|s| s.name.as_str()).collect()
    }
}

/// Refuses, before any work, a shape whose host data would not fit in available memory.
/// `checked_rows` gives the rows per head each shape's check holds to the references (at most).
/// With several `workers` (`--devices`), each holds a problem at once: the `workers` largest
/// problems must fit together, each shape counted once per seed (`seeds`). Each worker
/// computes with `threads` host threads (its per-thread scratch is counted that often).
pub fn check_host_memory(
    shapes: &[Shape],
    checked_rows: impl Fn(&Shape) -> usize,
    available_bytes: Option<u64>,
    workers: usize,
    seeds: usize,
    threads: usize,
) -> Result<(), ConfigError> {
    const GIB: f64 = (1u64 << 30) as f64;
    let too_large = |needed: Option<u64>| match (needed, available_bytes) {
        (None, _) => true,
        (Some(n), Some(avail)) => n > avail,
        (Some(_), None) => false,
    };
    let refuse = |shape: &Shape, what: String, needed: Option<u64>| ConfigError::TooLarge {
        name: shape.name.clone(),
        what,
        needed_gib: needed.map_or(f64::INFINITY, |n| n as f64 / GIB),
        available_gib: available_bytes.map_or(0.0, |a| a as f64 / GIB),
    };
    let mut needs = Vec::with_capacity(shapes.len());
    for shape in shapes {
        let needed = shape.host_bytes_needed(checked_rows(shape), threads);
        if too_large(needed) {
            return Err(refuse(shape, "host memory".into(), needed));
        }
        needs.extend(std::iter::repeat_n(
            (needed.unwrap_or(0), shape),
            seeds.min(workers),
        ));
    }
    if workers > 1 {
        needs.sort_by_key(|n| std::cmp::Reverse(n.0));
        let together: u64 = needs.iter().take(workers).map(|n| n.0).sum();
        if let Some((_, largest)) = needs.first()
            && too_large(Some(together))
        {
            return Err(refuse(
                largest,
                format!(
                    "host memory with the {workers} workers of --devices holding problems at \
                     once (fewer --devices need less)"
                ),
                Some(together),
            ));
        }
    }
    Ok(())
}

/// `MemAvailable` from /proc/meminfo, if this system has one.
pub fn available_host_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> ShapeCatalog {
        let text = r#"{"version":1,"shapes":[
            {"name":"small","B":1,"H":1,"S":32,"D":64},
            {"name":"wide","B":1,"H":2,"S":200,"D":64,"qk_std":2.0,"purpose":"rescale"}]}"#;
        ShapeCatalog::parse(Path::new("test.json"), text).unwrap()
    }

    #[test]
    fn names_and_inline_shapes_resolve_in_order_without_duplicates() {
        let shapes = catalog().select("wide, 2x3x77x64,small,wide").unwrap();
        let names: Vec<_> = shapes.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["wide", "2x3x77x64", "small"]);
        assert_eq!(
            (shapes[1].b, shapes[1].h, shapes[1].s, shapes[1].d),
            (2, 3, 77, 64)
        );
        assert_eq!(shapes[0].qk_std, 2.0);
    }

    #[test]
    fn unknown_shape_message_lists_the_known_ones() {
        let err = catalog().select("small,bogus").unwrap_err().to_string();
        assert!(
            err.contains("bogus") && err.contains("small, wide"),
            "{err}"
        );
    }

    #[test]
    fn zero_sequence_length_is_refused() {
        let err = catalog().select("1x1x0x64").unwrap_err().to_string();
        assert!(err.contains("S=0"), "{err}");
    }

    #[test]
    fn head_dim_other_than_64_is_refused() {
        let err = catalog().select("1x1x128x128").unwrap_err().to_string();
        assert!(err.contains("D=128") && err.contains("64"), "{err}");
    }

    #[test]
    fn shapes_file_with_unknown_key_names_the_key() {
        let text = r#"{"version":1,"shapes":[{"name":"a","B":1,"H":1,"S":4,"D":64,"Z":3}]}"#;
        let err = ShapeCatalog::parse(Path::new("f.json"), text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("f.json") && err.contains("Z"), "{err}");
    }

    #[test]
    fn shapes_file_with_a_bad_shape_names_its_index() {
        let text = r#"{"version":1,"shapes":[{"name":"a","B":1,"H":1,"S":4,"D":32}]}"#;
        let err = ShapeCatalog::parse(Path::new("f.json"), text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("shapes[0]") && err.contains("D=32"), "{err}");
    }

    #[test]
    fn shapes_file_with_a_missing_key_names_it() {
        let text = r#"{"version":1,"shapes":[{"name":"a","B":1,"H":1,"D":64}]}"#;
        let err = ShapeCatalog::parse(Path::new("f.json"), text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`S`"), "{err}");
    }

    #[test]
    fn a_shape_too_large_for_memory_is_refused_with_the_size_it_needs() {
        let shapes = catalog().select("64x64x65536x64").unwrap();
        let every_row = |s: &Shape| s.s;
        let err = check_host_memory(&shapes, every_row, Some(8 << 30), 1, 1, 16)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("GiB") && err.contains("64x64x65536x64"),
            "{err}"
        );
        assert!(
            check_host_memory(
                &catalog().select("small").unwrap(),
                every_row,
                Some(8 << 30),
                1,
                1,
                16
            )
            .is_ok()
        );
        // 2^31 elements: 42 GiB for the inputs, codes and outputs, then 36 bytes per checked
        // element and 58.7 MB per worker: 46.5 GiB with 1024 of 16384 rows per head on one
        // worker, 114 GiB with every row.
        let big = catalog().select("128x16x16384x64").unwrap();
        let gib = |rows: usize, threads| {
            big[0].host_bytes_needed(rows, threads).unwrap() as f64 / (1u64 << 30) as f64
        };
        assert!(
            (gib(1024, 1) - 46.5).abs() < 0.1 && (gib(16384, 1) - 114.0).abs() < 0.1,
            "{} {}",
            gib(1024, 1),
            gib(16384, 1)
        );
        assert!((gib(1024, 16) - gib(1024, 1) - 15.0 * 58.72e6 / (1u64 << 30) as f64).abs() < 0.01);
        assert!(check_host_memory(&big, |_| 1024, Some(64 << 30), 1, 1, 16).is_ok());
        assert!(check_host_memory(&big, every_row, Some(64 << 30), 1, 1, 16).is_err());
    }

    #[test]
    fn several_workers_must_fit_their_largest_problems_together() {
        // 46.5 GiB for one problem of the 2^31 shape: one fits in 64 GiB, two do not.
        let big = catalog().select("128x16x16384x64").unwrap();
        let rows = |_: &Shape| 1024;
        let fits =
            |workers, seeds| check_host_memory(&big, rows, Some(64 << 30), workers, seeds, 16);
        assert!(fits(1, 2).is_ok());
        assert!(fits(2, 1).is_ok(), "one seed: only one worker holds it");
        let err = fits(2, 2).unwrap_err().to_string();
        let one = big[0].host_bytes_needed(1024, 16).unwrap();
        let both = format!("{:.1} GiB", 2.0 * one as f64 / (1u64 << 30) as f64);
        assert!(
            err.contains("2 workers") && err.contains(&both),
            "{both}: {err}"
        );
        let mut two = big.clone();
        two.extend(catalog().select("small").unwrap());
        assert!(check_host_memory(&two, rows, Some(64 << 30), 2, 1, 16).is_ok());
    }

    #[test]
    fn each_worker_counts_the_scratch_of_its_own_threads_only() {
        // 1x1x65536x64, every row: 235 MB of scratch per thread and 0.24 GB of the rest per
        // problem; two workers hold a problem each.
        let long = catalog().select("1x1x65536x64").unwrap();
        let rows = |s: &Shape| s.s;
        let per_thread = 65536.0 * (5.0 * 64.0 * 8.0 + 1024.0);
        let avail = (0.5e9 + 2.0 * 16.0 * per_thread) as u64;
        let fits = |threads| check_host_memory(&long, rows, Some(avail), 2, 2, threads);
        assert!(fits(16).is_ok(), "two workers of 16 threads fit");
        assert!(fits(32).is_err(), "two workers of 32 threads do not");
    }

    #[test]
    fn all_selects_the_shapes_list_and_by_name_shapes_only_when_named() {
        let text = r#"{"version":1,"shapes":[{"name":"small","B":1,"H":1,"S":32,"D":64}],
            "by_name":[{"name":"huge","B":1,"H":1,"S":65536,"D":64}]}"#;
        let c = ShapeCatalog::parse(Path::new("t.json"), text).unwrap();
        let names = |spec| {
            c.select(spec)
                .unwrap()
                .into_iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names("all"), ["small"]);
        assert_eq!(names("all,huge"), ["small", "huge"]);
        assert!(!c.in_all("huge") && c.in_all("small") && c.shapes().len() == 2);
        let twice = r#"{"version":1,"shapes":[{"name":"a","B":1,"H":1,"S":32,"D":64}],
            "by_name":[{"name":"a","B":1,"H":1,"S":64,"D":64}]}"#;
        let err = ShapeCatalog::parse(Path::new("t.json"), twice)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("by_name[0].name") && err.contains("defined twice"),
            "{err}"
        );
    }
}
