//! Problem descriptions: the shapes file, inline `BxHxSxD[:options]` shapes, and the checks
//! that refuse what the kernel cannot run (S = 0, an unsupported D, H_q not a multiple of
//! H_kv) before any work starts.
//!
//! A problem is B, H_q, H_kv, S_q, S_k, D and causal (docs/DESIGN.md "Problems"): Q and O are
//! `[B, H_q, S_q, D]`, K and V `[B, H_kv, S_k, D]`; query head h reads K/V head
//! h / (H_q / H_kv). Causal masks are bottom-right aligned: query i sees keys
//! j <= i + S_k - S_q, so a query row may see no key at all (S_q > S_k); such a row is zero.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::usage::ConfigError;

/// The allowed spread of Q and K: the range the checks were proven over. Inputs are drawn in
/// f32 and scores computed in f32; at qk_std 100 a score reaches about 100² · 6² · 64 / 8 ≈
/// 3e6, far inside f32 and already a one-hot softmax; at 1e-3 the softmax is uniform to f16's
/// resolution. Beyond them nothing new is tested, and far beyond, f32 overflows.
pub const QK_STD_MIN: f64 = 1e-3;
pub const QK_STD_MAX: f64 = 100.0;

/// The head dimensions the Stage-C kernel is compiled for (one instantiation each,
/// cuda/sdpa_fp8_stage_c_mma.cu), the emulation and the references follow.
pub const HEAD_DIMS: [usize; 2] = [64, 128];

/// A kernel entry: the instantiation for one head dimension, with or without the causal mask
/// (cuda/sdpa_fp8_stage_c_mma.cu compiles each in a module of its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Entry {
    pub d: usize,
    pub causal: bool,
}

impl Entry {
    /// The entry every build has: D = 64 without a mask (the main job's).
    pub const BASE: Entry = Entry {
        d: 64,
        causal: false,
    };

    /// Every entry the kernel defines.
    pub fn all() -> Vec<Entry> {
        HEAD_DIMS
            .iter()
            .flat_map(|&d| [false, true].map(|causal| Entry { d, causal }))
            .collect()
    }

    /// The entries `shapes` run on, sorted, each once.
    pub fn of(shapes: &[Shape]) -> Vec<Entry> {
        let mut entries: Vec<Entry> = shapes.iter().map(Shape::entry).collect();
        entries.sort_unstable();
        entries.dedup();
        entries
    }

    /// Its suffix of the kernel's entry names and of the records: `d64`, `d128_causal`.
    pub fn suffix(&self) -> String {
        format!("d{}{}", self.d, if self.causal { "_causal" } else { "" })
    }
}

/// One attention problem: `[B, H_q, S_q, D]` queries against `[B, H_kv, S_k, D]` keys and
/// values, optionally causal, plus how its inputs are drawn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "RawShape", into = "RawShape")]
pub struct Shape {
    pub name: String,
    pub b: usize,
    /// H_q: query (and output) heads.
    pub h: usize,
    /// S_q: query rows per head.
    pub s: usize,
    pub d: usize,
    /// H_kv: K/V heads; divides H_q (GQA; 1 is MQA, H_q plain multi-head attention).
    pub hkv: usize,
    /// S_k: keys per head.
    pub sk: usize,
    /// Bottom-right aligned causal mask.
    pub causal: bool,
    /// Standard deviation of Q and K (V is always standard normal). Above 1 it widens the
    /// score range, so the online-softmax rescale across KV tiles carries real weight.
    pub qk_std: f64,
    /// What the shape is for, shown by `sdpa-runner shapes`.
    pub purpose: String,
    /// How the inputs are drawn beyond the normal draws ([`Dist`]).
    pub dist: Dist,
    /// Q and K rotated along D by the normalized Hadamard matrix H after they are drawn and
    /// before they are quantized (FlashAttention-3's incoherent processing, docs/ACCURACY.md):
    /// QH(KH)ᵀ = QKᵀ, so the scores and the output are those of the drawn inputs (up to one
    /// f32 rounding of the rotated values); only what FP8 makes of them changes.
    pub rotate: bool,
}

/// A shape as the shapes file writes it: `Hkv` and `Sk` default to `H` and `S`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShape {
    name: String,
    #[serde(rename = "B")]
    b: usize,
    #[serde(rename = "H")]
    h: usize,
    #[serde(rename = "S")]
    s: usize,
    #[serde(rename = "D")]
    d: usize,
    #[serde(rename = "Hkv", default, skip_serializing_if = "Option::is_none")]
    hkv: Option<usize>,
    #[serde(rename = "Sk", default, skip_serializing_if = "Option::is_none")]
    sk: Option<usize>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    causal: bool,
    #[serde(default = "unit_std", skip_serializing_if = "is_unit_std")]
    qk_std: f64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    purpose: String,
    #[serde(default, skip_serializing_if = "Dist::is_normal")]
    dist: Dist,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    rotate: bool,
}

impl From<RawShape> for Shape {
    fn from(r: RawShape) -> Self {
        Shape {
            hkv: r.hkv.unwrap_or(r.h),
            sk: r.sk.unwrap_or(r.s),
            name: r.name,
            b: r.b,
            h: r.h,
            s: r.s,
            d: r.d,
            causal: r.causal,
            qk_std: r.qk_std,
            purpose: r.purpose,
            dist: r.dist,
            rotate: r.rotate,
        }
    }
}

impl From<Shape> for RawShape {
    fn from(s: Shape) -> Self {
        RawShape {
            hkv: (s.hkv != s.h).then_some(s.hkv),
            sk: (s.sk != s.s).then_some(s.sk),
            name: s.name,
            b: s.b,
            h: s.h,
            s: s.s,
            d: s.d,
            causal: s.causal,
            qk_std: s.qk_std,
            purpose: s.purpose,
            dist: s.dist,
            rotate: s.rotate,
        }
    }
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
    /// FlashAttention-3's outliers (its paper, §4.3): every element of Q, K and V is
    /// N(0, 1) + N(0, 100)·Bernoulli(0.001), one element in a thousand gets a normal draw of
    /// standard deviation 10 added, so each head's scale follows a few large values.
    Fa3Outliers,
    /// An attention sink: every query gets +u (u a random direction) and key 0 of each K/V
    /// head becomes u / 2, so every row gives its first key a score about D·qk²/(4√D) above
    /// the rest (8 at D = 64) without making the softmax one-hot.
    Sink,
    /// Four distinct value rows per K/V head times 1000 (|O| stays within f16's range): the
    /// head's V scale follows them, so most other values land among E4M3's subnormals or
    /// flush to zero.
    HugeV,
    /// Q times 10^-3: near-constant scores, nearly uniform weights, every key counts.
    Flat,
    /// Every query gets +u and key 0 becomes c·u, with c set so its score sits ln 64 above
    /// a typical key's: the other weights land around 2^-6 of the largest, E4M3's smallest
    /// normal, where a P rounded to e4m3 (FP8 attention's second GEMM) turns subnormal.
    PEdge,
    /// Every key gets −2u, and every query +u in even rows, −u in odd ones (u a shared random
    /// direction, rows counted through the query heads of a K/V head): an even row's scores sit
    /// about 2|u|² ≈ 2D·qk² below zero and an odd row's as far above, 6.5 times the normal
    /// part's spread (√(6D)·qk²) at D = 64 (|u|² itself varies by about ±18% a K/V head there),
    /// so each row's scores have one sign, all but certainly. A warp's threads hold rows of one
    /// parity each, so in Stage D's `row_maxima_int` (cuda/sdpa_fp8_stage_d_wgmma.cu) and in
    /// Stage C's 32-row `lane_row_tree` (cuda/sdpa_fp8_stage_c_mma.cu, a lane's rows g, g + 8,
    /// 16 + g and 24 + g) half of them fall back and half do not. Also catches a row maximum started from 0 instead of −∞.
    Negative,
}

impl Dist {
    pub const ALL: [Dist; 11] = [
        Dist::Normal,
        Dist::Outliers,
        Dist::ConstantRows,
        Dist::Spike,
        Dist::HeadScale,
        Dist::Fa3Outliers,
        Dist::Sink,
        Dist::HugeV,
        Dist::Flat,
        Dist::PEdge,
        Dist::Negative,
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
            Dist::Fa3Outliers => "fa3_outliers",
            Dist::Sink => "sink",
            Dist::HugeV => "huge_v",
            Dist::Flat => "flat",
            Dist::PEdge => "p_edge",
            Dist::Negative => "negative",
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
    /// Plain multi-head attention: H_kv = H, S_k = S, no mask, normal draws of unit spread.
    pub fn new(name: &str, b: usize, h: usize, s: usize, d: usize) -> Self {
        Shape {
            name: name.into(),
            b,
            h,
            s,
            d,
            hkv: h,
            sk: s,
            causal: false,
            qk_std: 1.0,
            purpose: String::new(),
            dist: Dist::Normal,
            rotate: false,
        }
    }

    /// Elements in Q or O; `None` if the count overflows.
    pub fn elements(&self) -> Option<usize> {
        self.b
            .checked_mul(self.h)?
            .checked_mul(self.s)?
            .checked_mul(self.d)
    }

    /// Elements in K or V; `None` if the count overflows.
    pub fn kv_elements(&self) -> Option<usize> {
        self.b
            .checked_mul(self.hkv)?
            .checked_mul(self.sk)?
            .checked_mul(self.d)
    }

    /// Number of (batch, query head) pairs: one Q scale each, one grid row each on the GPU.
    pub fn heads(&self) -> usize {
        self.b * self.h
    }

    /// Number of (batch, K/V head) pairs: one K and one V scale each.
    pub fn kv_heads(&self) -> usize {
        self.b * self.hkv
    }

    /// Query heads per K/V head (H_q / H_kv).
    pub fn group(&self) -> usize {
        self.h / self.hkv
    }

    /// The (batch, K/V head) index that (batch, query head) index `bh` reads.
    pub fn kv_head_of(&self, bh: usize) -> usize {
        let (b, h) = (bh / self.h, bh % self.h);
        b * self.hkv + h / self.group()
    }

    /// Keys query row `row` sees: all S_k, or under the bottom-right causal mask the keys
    /// j <= row + S_k - S_q (none when that is negative).
    pub fn visible_keys(&self, row: usize) -> usize {
        if self.causal {
            (row + self.sk + 1).saturating_sub(self.s).min(self.sk)
        } else {
            self.sk
        }
    }

    /// Unmasked (query, key) pairs over all heads: what a FLOP count counts
    /// (4·D FLOPs each), so causal rates compare with peers'.
    pub fn unmasked_pairs(&self) -> u128 {
        let (s, sk) = (self.s as i128, self.sk as i128);
        let per_head = if self.causal {
            // Row r sees max(0, r + c) keys, c = S_k - S_q + 1: an arithmetic series from the
            // first row that sees a key up to the last row, which sees all S_k.
            let c = sk - s + 1;
            let first_row = (-c).max(0);
            let n = s - first_row;
            n * (first_row + c + sk) / 2
        } else {
            s * sk
        };
        per_head as u128 * self.heads() as u128
    }

    /// The kernel entry this problem runs on: its head dimension and whether it is causal.
    pub fn entry(&self) -> Entry {
        Entry {
            d: self.d,
            causal: self.causal,
        }
    }

    /// Whether this is the configuration every check held before GQA, masks and S_q != S_k:
    /// H_kv = H, S_k = S, no mask.
    pub fn is_plain(&self) -> bool {
        self.hkv == self.h && self.sk == self.s && !self.causal
    }

    /// `BxHxSxD` and the options that differ from plain attention, as inline shapes write
    /// them: e.g. `1x32x512x128:sk=4096:hkv=8:causal`.
    pub fn dims(&self) -> String {
        let mut t = format!("{}x{}x{}x{}", self.b, self.h, self.s, self.d);
        if self.sk != self.s {
            t.push_str(&format!(":sk={}", self.sk));
        }
        if self.hkv != self.h {
            t.push_str(&format!(":hkv={}", self.hkv));
        }
        if self.causal {
            t.push_str(":causal");
        }
        t
    }

    /// The default softmax scale, 1/sqrt(D).
    pub fn softmax_scale(&self) -> f32 {
        1.0 / (self.d as f32).sqrt()
    }

    /// Checks what the kernel and the runner can handle; the message names the offending field
    /// and the rule it breaks.
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
        if self.hkv == 0 {
            return Err("Hkv=0: there must be at least one K/V head (Hkv=1 is MQA)".into());
        }
        if !self.h.is_multiple_of(self.hkv) {
            return Err(format!(
                "Hkv={} does not divide H={}: each K/V head serves H/Hkv query heads, so H \
                 must be a multiple of Hkv",
                self.hkv, self.h
            ));
        }
        if self.s == 0 {
            return Err("S=0: the sequence length must be at least 1".into());
        }
        if self.sk == 0 {
            return Err("Sk=0: there must be at least one key (S_k >= 1)".into());
        }
        for (key, value) in [("S", self.s), ("Sk", self.sk)] {
            if value > i32::MAX as usize {
                return Err(format!(
                    "{key}={value}: the kernel takes it as a 32-bit int; the most is {}",
                    i32::MAX
                ));
            }
        }
        if !HEAD_DIMS.contains(&self.d) {
            return Err(format!(
                "D={}: the kernels, the emulation and the references support D = {} only \
                 (`sdpa-runner kernels`; D = 256 would need more registers per thread than \
                 Stage C's warp grid leaves)",
                self.d,
                HEAD_DIMS.map(|d| d.to_string()).join(" and ")
            ));
        }
        if !(self.qk_std.is_finite() && (QK_STD_MIN..=QK_STD_MAX).contains(&self.qk_std)) {
            return Err(format!(
                "qk_std={} is out of range: allowed {QK_STD_MIN} to {QK_STD_MAX} (beyond them \
                 the f32 inputs or their scores leave the range the kernel computes in)",
                self.qk_std
            ));
        }
        if self.rotate && !self.d.is_power_of_two() {
            return Err(format!(
                "D={} with rotate: the Hadamard rotation needs D a power of two",
                self.d
            ));
        }
        if self.elements().is_none() || self.kv_elements().is_none() {
            return Err("B*H*S*D or B*Hkv*Sk*D overflows".into());
        }
        Ok(())
    }

    /// Host bytes one (shape, seed) needs at its peak when `checked_rows` rows per head are
    /// held to the references by `threads` workers: per Q/O element the inputs (f32) and
    /// codes, three f16 outputs (stress keeps a first output beside two concurrent ones); per
    /// K/V element two f32 inputs and two codes; per checked element the two references and
    /// their bounds (f64), the emulation (f16) with a copy and the spread (two f64); per worker
    /// one K/V head's f64 operands and its 64-row blocks (below).
    pub fn host_bytes_needed(&self, checked_rows: usize, threads: usize) -> Option<u64> {
        const PER_Q_ELEMENT: u64 = 4 + 1 + 3 * 2;
        const PER_KV_ELEMENT: u64 = 2 * 4 + 2;
        // Two references and bounds, the emulation and its copy, and the implementation
        // model's spread (two f64, src/reference/model.rs `Spread`).
        const PER_CHECKED: u64 = 4 * 8 + 2 + 2 + 2 * 8;
        let n = self.elements()? as u64;
        let nkv = self.kv_elements()? as u64;
        let checked = (self.heads() as u64)
            .checked_mul(checked_rows.min(self.s) as u64)?
            .checked_mul(self.d as u64)?;
        // Per key: K, V, |V| of the codes, K, V of the inputs, V² (spread), and four 64-row
        // blocks (two score blocks, the two squared weight blocks of the spread).
        let per_worker = (self.sk as u64).checked_mul(6 * self.d as u64 * 8 + 4 * 64 * 8)?;
        n.checked_mul(PER_Q_ELEMENT)?
            .checked_add(nkv.checked_mul(PER_KV_ELEMENT)?)?
            .checked_add(checked.checked_mul(PER_CHECKED)?)?
            .checked_add(per_worker.checked_mul(threads as u64)?)
    }

    /// The inline spelling of this shape,
    /// `BxHxSxD[:sk=N][:hkv=N][:causal][:qk=F][:dist=NAME][:rotate]`,
    /// which [`Shape::parse_inline`] reads back to the same problem (a one-line reproduction).
    pub fn inline(&self) -> String {
        let mut t = self.dims();
        if self.qk_std != 1.0 {
            t.push_str(&format!(":qk={}", self.qk_std));
        }
        if !self.dist.is_normal() {
            t.push_str(&format!(":dist={}", self.dist.name()));
        }
        if self.rotate {
            t.push_str(":rotate");
        }
        t
    }

    /// Parses an inline `BxHxSxD[:sk=N][:hkv=N][:causal][:qk=F][:dist=NAME][:rotate]` shape; `None` if
    /// `text` does not start with `BxHxSxD`.
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
        let bad = |message: String| {
            Some(Err(ConfigError::BadShape {
                name: text.into(),
                message,
            }))
        };
        let mut dims = [0usize; 4];
        for (slot, part) in dims.iter_mut().zip(&parts) {
            match part.parse() {
                Ok(v) => *slot = v,
                Err(_) => return bad(format!("`{part}` is too large")),
            }
        }
        let mut shape = Shape::new(
            &text.to_ascii_lowercase(),
            dims[0],
            dims[1],
            dims[2],
            dims[3],
        );
        const GRAMMAR: &str = "BxHxSxD[:sk=N][:hkv=N][:causal][:qk=F][:dist=NAME][:rotate]";
        for option in options {
            let count = |v: &str, key: &str| {
                v.parse::<usize>()
                    .map_err(|_| format!("{key}=`{v}` is not a non-negative integer"))
            };
            match option.split_once('=') {
                Some(("sk", v)) => match count(v, "sk") {
                    Ok(n) => shape.sk = n,
                    Err(m) => return bad(m),
                },
                Some(("hkv", v)) => match count(v, "hkv") {
                    Ok(n) => shape.hkv = n,
                    Err(m) => return bad(m),
                },
                None if option == "causal" => shape.causal = true,
                None if option == "rotate" => shape.rotate = true,
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
                _ => return bad(format!("`{option}` is not an option; write {GRAMMAR}")),
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
    /// Named sets of shapes (e.g. `llm`), selected by their name like a shape.
    #[serde(default)]
    sets: std::collections::BTreeMap<String, Vec<String>>,
}

/// The shapes of one shapes file, validated.
#[derive(Debug, Clone)]
pub struct ShapeCatalog {
    path: PathBuf,
    /// `shapes`, then `by_name`.
    shapes: Vec<Shape>,
    /// How many of them `all` selects (the `shapes` list).
    in_all: usize,
    /// Named sets: each a list of the file's shape names.
    sets: std::collections::BTreeMap<String, Vec<String>>,
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
        for (set, members) in &file.sets {
            let key = format!("sets.{set}");
            if members.is_empty() {
                return Err(ConfigError::invalid_key(path, key, "the set is empty"));
            }
            if set == "all" || shapes.iter().any(|s| &s.name == set) {
                return Err(ConfigError::invalid_key(
                    path,
                    key,
                    format!("`{set}` is already a shape's name (or `all`); pick another"),
                ));
            }
            if let Some(unknown) = members
                .iter()
                .find(|m| !shapes.iter().any(|s| &s.name == *m))
            {
                return Err(ConfigError::invalid_key(
                    path,
                    key,
                    format!("`{unknown}` is not a shape of this file"),
                ));
            }
        }
        Ok(ShapeCatalog {
            path: path.to_path_buf(),
            shapes,
            in_all,
            sets: file.sets,
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

    /// Resolves `--shapes`: comma-separated names of shapes or sets from this catalog, or
    /// inline `BxHxSxD[:options]` shapes; `all` selects every shape of the file's `shapes` list (not its `by_name` list).
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
            } else if let Some(members) = self.sets.get(item) {
                members
                    .iter()
                    .filter_map(|m| self.get(m).cloned())
                    .collect()
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

    /// The file's shape names, then its set names.
    pub fn names(&self) -> Vec<&str> {
        self.shapes
            .iter()
            .map(|s| s.name.as_str())
            .chain(self.sets.keys().map(String::as_str))
            .collect()
    }

    /// The named sets and their shapes.
    pub fn sets(&self) -> &std::collections::BTreeMap<String, Vec<String>> {
        &self.sets
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
    fn head_dims_other_than_64_and_128_are_refused_naming_the_supported_ones() {
        assert_eq!(catalog().select("1x1x128x128").unwrap()[0].d, 128);
        for d in [32, 96, 256] {
            let err = catalog()
                .select(&format!("1x1x128x{d}"))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("D={d}")) && err.contains("64 and 128"),
                "{err}"
            );
        }
    }

    #[test]
    fn rotate_is_an_inline_option_that_inline_writes_back_and_the_shapes_file_reads() {
        let r = Shape::parse_inline("1x16x4096x128:dist=fa3_outliers:rotate")
            .unwrap()
            .unwrap();
        assert!(r.rotate && r.dist == Dist::Fa3Outliers);
        assert_eq!(r.inline(), "1x16x4096x128:dist=fa3_outliers:rotate");
        assert!(
            !Shape::parse_inline("1x16x4096x128")
                .unwrap()
                .unwrap()
                .rotate
        );
        let raw: RawShape = serde_json::from_str(
            r#"{"name": "rot", "B": 1, "H": 2, "S": 8, "D": 64, "rotate": true}"#,
        )
        .unwrap();
        assert!(Shape::from(raw).rotate);
        let bad = Shape::parse_inline("1x1x8x64:rotated")
            .unwrap()
            .unwrap_err();
        assert!(bad.to_string().contains("[:rotate]"), "{bad}");
    }

    #[test]
    fn inline_options_describe_gqa_decode_chunked_prefill_and_causal_problems() {
        let c = catalog();
        let prefill = &c.select("1x32x4096x128:hkv=8:causal").unwrap()[0];
        assert_eq!(
            (prefill.h, prefill.hkv, prefill.s, prefill.sk),
            (32, 8, 4096, 4096)
        );
        assert!(prefill.causal && prefill.group() == 4);
        let decode = &c.select("16x32x1x128:sk=8192:hkv=8").unwrap()[0];
        assert_eq!((decode.s, decode.sk, decode.causal), (1, 8192, false));
        let chunk = &c.select("1x32x512x128:sk=4096:hkv=8:causal").unwrap()[0];
        assert_eq!(chunk.inline(), "1x32x512x128:sk=4096:hkv=8:causal");
        for s in [prefill, decode, chunk] {
            assert_eq!(&Shape::parse_inline(&s.inline()).unwrap().unwrap(), s);
        }
        // Query head h reads K/V head h / (H / H_kv), batch by batch.
        let g = Shape::parse_inline("2x8x4x64:hkv=2").unwrap().unwrap();
        let map: Vec<usize> = (0..16).map(|bh| g.kv_head_of(bh)).collect();
        assert_eq!(map, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
    }

    #[test]
    fn bad_descriptions_exit_naming_the_rule() {
        let c = catalog();
        let err = |spec: &str| c.select(spec).unwrap_err().to_string();
        assert!(err("1x6x64x64:hkv=4").contains("multiple of Hkv"));
        assert!(err("1x6x64x64:hkv=0").contains("Hkv=0"));
        assert!(err("1x6x64x64:sk=0").contains("Sk=0"));
        assert!(err("1x6x64x64:sk=-3").contains("non-negative integer"));
        assert!(err("1x6x64x64:mask").contains("not an option"));
        assert!(matches!(
            c.select("1x6x64x64:hkv=4").unwrap_err(),
            ConfigError::BadShape { .. }
        ));
    }

    #[test]
    fn the_bottom_right_causal_mask_counts_each_rows_keys() {
        let sh = |t: &str| Shape::parse_inline(t).unwrap().unwrap();
        // S_q = S_k: row i sees i + 1 keys.
        let square = sh("1x1x5x64:causal");
        assert_eq!(
            (0..5).map(|r| square.visible_keys(r)).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        // S_q < S_k (chunked prefill): the last row sees every key.
        let chunk = sh("1x1x3x64:sk=7:causal");
        assert_eq!(
            (0..3).map(|r| chunk.visible_keys(r)).collect::<Vec<_>>(),
            [5, 6, 7]
        );
        // S_q > S_k: the first S_q - S_k rows see nothing.
        let tall = sh("1x1x6x64:sk=3:causal");
        assert_eq!(
            (0..6).map(|r| tall.visible_keys(r)).collect::<Vec<_>>(),
            [0, 0, 0, 1, 2, 3]
        );
        assert_eq!(sh("1x1x6x64:sk=3").visible_keys(0), 3);
        // Unmasked pairs: the closed form is the sum over rows.
        for s in [
            square,
            chunk,
            tall,
            sh("2x4x77x64:sk=300:hkv=2:causal"),
            sh("1x1x300x64:sk=77:causal"),
        ] {
            let sum: u128 =
                (0..s.s).map(|r| s.visible_keys(r) as u128).sum::<u128>() * s.heads() as u128;
            assert_eq!(s.unmasked_pairs(), sum, "{}", s.dims());
        }
        assert_eq!(sh("2x3x10x64:sk=20").unmasked_pairs(), 2 * 3 * 10 * 20);
    }

    #[test]
    fn the_shapes_file_reads_hkv_sk_causal_and_named_sets() {
        let text = r#"{"version":1,"shapes":[{"name":"a","B":1,"H":4,"S":32,"D":64}],
            "by_name":[{"name":"g","B":1,"H":4,"Hkv":2,"S":8,"Sk":64,"D":128,"causal":true}],
            "sets":{"llm":["g","a"]}}"#;
        let c = ShapeCatalog::parse(Path::new("t.json"), text).unwrap();
        let set = c.select("llm").unwrap();
        assert_eq!(
            set.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["g", "a"]
        );
        assert_eq!((set[0].hkv, set[0].sk, set[0].causal), (2, 64, true));
        assert_eq!((set[1].hkv, set[1].sk, set[1].causal), (4, 32, false));
        let json = serde_json::to_string(&set[1]).unwrap();
        assert!(
            !json.contains("Hkv") && !json.contains("causal"),
            "plain shapes write no defaults: {json}"
        );
        let bad = text.replace(r#"["g","a"]"#, r#"["g","zzz"]"#);
        let err = ShapeCatalog::parse(Path::new("t.json"), &bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sets.llm") && err.contains("zzz"), "{err}");
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
        // 2^31 elements: 42 GiB for the inputs, codes and outputs, then 52 bytes per checked
        // element and 83.9 MB per worker: 48.6 GiB with 1024 of 16384 rows per head on one
        // worker, 146.1 GiB with every row.
        let big = catalog().select("128x16x16384x64").unwrap();
        let gib = |rows: usize, threads| {
            big[0].host_bytes_needed(rows, threads).unwrap() as f64 / (1u64 << 30) as f64
        };
        assert!(
            (gib(1024, 1) - 48.6).abs() < 0.1 && (gib(16384, 1) - 146.1).abs() < 0.1,
            "{} {}",
            gib(1024, 1),
            gib(16384, 1)
        );
        assert!((gib(1024, 16) - gib(1024, 1) - 15.0 * 83.89e6 / (1u64 << 30) as f64).abs() < 0.01);
        assert!(check_host_memory(&big, |_| 1024, Some(64 << 30), 1, 1, 16).is_ok());
        assert!(check_host_memory(&big, every_row, Some(64 << 30), 1, 1, 16).is_err());
    }

    #[test]
    fn several_workers_must_fit_their_largest_problems_together() {
        // 48.6 GiB for one problem of the 2^31 shape: one fits in 64 GiB, two do not.
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
        // 1x1x65536x64, every row: 335 MB of scratch per thread and 0.31 GB of the rest per
        // problem; two workers hold a problem each.
        let long = catalog().select("1x1x65536x64").unwrap();
        let rows = |s: &Shape| s.s;
        let per_thread = 65536.0 * (6.0 * 64.0 * 8.0 + 2048.0);
        let avail = (0.7e9 + 2.0 * 16.0 * per_thread) as u64;
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
