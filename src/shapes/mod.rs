//! Problem descriptions and the checks that refuse what the kernel cannot run (S = 0, an
//! unsupported D, H_q not a multiple of H_kv) before any work starts; where they come from:
//! the shapes file (catalog.rs) and inline `BxHxSxD[:options]` shapes (inline.rs); whether a
//! run's problems fit the host's memory (memory.rs).
//!
//! A problem is B, H_q, H_kv, S_q, S_k, D and causal (docs/DESIGN.md "Problems"): Q and O are
//! `[B, H_q, S_q, D]`, K and V `[B, H_kv, S_k, D]`; query head h reads K/V head
//! h / (H_q / H_kv). Causal masks are bottom-right aligned: query i sees keys
//! j <= i + S_k - S_q, so a query row may see no key at all (S_q > S_k); such a row is zero.

use serde::{Deserialize, Serialize};

mod catalog;
mod inline;
mod memory;

pub use catalog::ShapeCatalog;
pub use memory::{available_host_memory, check_host_memory};

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
    /// Q times 10^-3 as in `Flat`, and every value |x| + 1/2 (mean about 1.3): every key
    /// weighs about the same and every product of P·V has one sign, so O grows with S_k. An O
    /// summed in the FP8 tensor cores' FP22 accumulator over every key, without a promotion to
    /// f32 every few steps, stagnates once it is 2^13 times one key's product: cuDNN's FP8
    /// SDPA comes out 18% short at S_k 8192 and 35% at 16384 on an H100 and an H200, where Stage D, which
    /// promotes every 128-key tile, does not (docs/PERF.md "Stage D, stop 58").
    FlatPositiveV,
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
    pub const ALL: [Dist; 12] = [
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
        Dist::FlatPositiveV,
    ];

    pub fn is_normal(&self) -> bool {
        *self == Dist::Normal
    }

    /// Whether each row of V is drawn independently of Q, K and the other rows, with a
    /// distribution that v_j → −v_j leaves unchanged: the premise of the FP8 implementation
    /// model's statistical terms (src/reference/model.rs; docs/DESIGN.md "Grading other implementations"),
    /// which bound sums over V's signs as fair coins. Where it fails, only the worst case holds.
    pub fn v_signs_symmetric(&self) -> bool {
        !matches!(self, Dist::FlatPositiveV)
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
            Dist::FlatPositiveV => "flat_positive_v",
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use catalog::sample_catalog;

    #[test]
    fn zero_sequence_length_is_refused() {
        let err = sample_catalog().select("1x1x0x64").unwrap_err().to_string();
        assert!(err.contains("S=0"), "{err}");
    }

    #[test]
    fn head_dims_other_than_64_and_128_are_refused_naming_the_supported_ones() {
        assert_eq!(sample_catalog().select("1x1x128x128").unwrap()[0].d, 128);
        for d in [32, 96, 256] {
            let err = sample_catalog()
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
}
