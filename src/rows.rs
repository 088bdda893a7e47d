//! Which query rows of each (b, h) head a correctness check holds against the references
//! (docs/DESIGN.md "Checked rows").
//!
//! Rows of attention are independent, so the O(S²) references and emulation need only the
//! rows being checked. Up to [`AUTO_FULL_MAX_SCORES`] every row is checked; above it `auto`
//! checks a stated set per head: every row of the first and last query tile, the rows on both
//! sides of every query-tile boundary (so every CTA's first and last row, for each tile size
//! the variants launch with), and [`RANDOM_ROWS`] rows drawn from the seed. Every output
//! element, checked row or not, is still checked for unwritten and non-finite values
//! (src/metrics.rs).
//!
//! The checked rows of all heads form the *compact layout*: head by head, rows ascending,
//! `D` values each. With every row checked it is the output's own `[B, H, S, D]` layout.

use std::borrow::Cow;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest, Sha256};

use crate::shapes::Shape;
use crate::usage::ConfigError;

/// `--check-rows`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CheckRows {
    /// Every row up to 2^28 score elements (B·H·S², the size of `large`), sampled above
    #[default]
    Auto,
    /// Every row of every head, whatever it costs
    All,
    /// The sampled rule on any shape
    Sampled,
}

/// Score elements (B·H·S²) up to which `auto` checks every row: `large` (1x16x4096x64), about
/// 4 s of host time on a 16-core machine. Every shape the gates were calibrated and fuzzed
/// on lies below it.
pub const AUTO_FULL_MAX_SCORES: u128 = 1 << 28;

/// Rows drawn at random per head under the sampled rule.
pub const RANDOM_ROWS: usize = 64;

/// The largest query tile (rows per CTA) the runner accepts from a kernel (and the smallest,
/// [`MIN_QUERY_TILE`]): the host-memory bound below holds for tiles in between
/// (src/backend/cuda/kernel.rs refuses a module that publishes others).
pub const MAX_QUERY_TILE: usize = 256;
pub const MIN_QUERY_TILE: usize = 16;

/// At most how many rows per head `rule` checks of `shape` (for the host-memory check, before
/// the variants' tile sizes are known: any tiles of 16 to 256 rows).
pub fn max_rows_per_head(rule: CheckRows, shape: &Shape) -> usize {
    if samples(rule, shape) {
        let diagonal = if shape.causal {
            2 * shape.sk / 64 + 8
        } else {
            0
        };
        shape
            .s
            .min(shape.s / 8 + 2 * MAX_QUERY_TILE + RANDOM_ROWS + diagonal)
    } else {
        shape.s
    }
}

/// Refuses, before any work, a shape whose host data under `rule` would not fit in the
/// memory available, with `workers` problems (of `seeds` seeds per shape) held at once
/// ([`crate::shapes::check_host_memory`]).
pub fn check_host_memory(
    shapes: &[Shape],
    rule: CheckRows,
    workers: usize,
    seeds: usize,
) -> Result<(), ConfigError> {
    crate::shapes::check_host_memory(
        shapes,
        |s| max_rows_per_head(rule, s),
        crate::shapes::available_host_memory(),
        workers,
        seeds,
        crate::shard::threads_per_worker(workers),
    )
}

/// Whether `rule` samples the rows of `shape` (rather than checking them all).
fn samples(rule: CheckRows, shape: &Shape) -> bool {
    let scores = shape.heads() as u128 * shape.s as u128 * shape.sk as u128;
    match rule {
        CheckRows::All => false,
        CheckRows::Auto => scores > AUTO_FULL_MAX_SCORES,
        CheckRows::Sampled => true,
    }
}

/// The rows checked in each head, and where each head's rows start in the compact layout.
#[derive(Debug, Clone)]
pub struct RowSet {
    s: usize,
    /// Sorted rows per head; `None` when every row is checked.
    sampled: Option<Vec<Vec<usize>>>,
    /// Compact row index of each head's first row, then the total (heads + 1 entries).
    offsets: Vec<usize>,
    rule: String,
    fingerprint: [u8; 32],
}

impl RowSet {
    /// Every row of every head.
    pub fn all(shape: &Shape) -> Self {
        let offsets = (0..=shape.heads()).map(|bh| bh * shape.s).collect();
        let mut h = Sha256::new();
        h.update(b"all");
        h.update((shape.heads() as u64).to_le_bytes());
        h.update((shape.s as u64).to_le_bytes());
        RowSet {
            s: shape.s,
            sampled: None,
            offsets,
            rule: "all".into(),
            fingerprint: h.finalize().into(),
        }
    }

    /// The rows `rule` checks of a (shape, seed) whose variants launch query tiles of
    /// `tiles` rows.
    pub fn choose(rule: CheckRows, shape: &Shape, seed: u64, tiles: &[usize]) -> Self {
        if samples(rule, shape) {
            Self::sampled(shape, seed, tiles)
        } else {
            Self::all(shape)
        }
    }

    /// The sampled rule (module docs); every row when it would pick them all.
    pub fn sampled(shape: &Shape, seed: u64, tiles: &[usize]) -> Self {
        let s = shape.s;
        let mut tiles: Vec<usize> = tiles.iter().copied().filter(|&t| t > 0).collect();
        tiles.sort_unstable();
        tiles.dedup();
        assert!(!tiles.is_empty(), "a query tile size is needed");
        let per_head: Vec<Vec<usize>> = (0..shape.heads())
            .map(|bh| head_rows(shape, seed, bh, &tiles))
            .collect();
        if per_head.iter().all(|rows| rows.len() == s) {
            return Self::all(shape);
        }
        let mut offsets = Vec::with_capacity(per_head.len() + 1);
        let mut h = Sha256::new();
        let mut total = 0;
        for rows in &per_head {
            offsets.push(total);
            total += rows.len();
            for &r in rows {
                h.update((r as u64).to_le_bytes());
            }
            h.update(b"/");
        }
        offsets.push(total);
        let sizes: Vec<String> = tiles.iter().map(|t| t.to_string()).collect();
        let diagonal = if shape.causal {
            ", the rows where the causal diagonal crosses a 64-key tile edge (seeing 64m and \
             64m + 1 keys), the first rows that see 1 and 2 keys and the last that sees none"
        } else {
            ""
        };
        let rule = format!(
            "sampled: per head every row of the first and last {t}-row query tile, both sides \
             of every {t}-row tile boundary{diagonal}, {RANDOM_ROWS} random rows of seed \
             {seed}; every element for unwritten and nonfinite",
            t = sizes.join("/")
        );
        RowSet {
            s,
            sampled: Some(per_head),
            offsets,
            rule,
            fingerprint: h.finalize().into(),
        }
    }

    pub fn is_all(&self) -> bool {
        self.sampled.is_none()
    }

    pub fn heads(&self) -> usize {
        self.offsets.len() - 1
    }

    /// Rows checked, all heads together.
    pub fn count(&self) -> usize {
        self.offsets[self.heads()]
    }

    /// Rows of the output, all heads together.
    pub fn total(&self) -> usize {
        self.heads() * self.s
    }

    /// The checked rows of head `bh`, ascending.
    pub fn rows(&self, bh: usize) -> Cow<'_, [usize]> {
        match &self.sampled {
            Some(per_head) => Cow::Borrowed(&per_head[bh]),
            None => Cow::Owned((0..self.s).collect()),
        }
    }

    /// Compact row index of head `bh`'s first checked row.
    pub fn offset(&self, bh: usize) -> usize {
        self.offsets[bh]
    }

    /// Every checked row as (its row in the output, counting all heads; its compact row).
    pub fn each(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.heads()).flat_map(move |bh| {
            let rows = self.rows(bh).into_owned();
            let (s, first) = (self.s, self.offsets[bh]);
            rows.into_iter()
                .enumerate()
                .map(move |(j, r)| (bh * s + r, first + j))
        })
    }

    /// The rule, as correctness.json and the console state it.
    pub fn rule(&self) -> &str {
        &self.rule
    }

    /// Equal for equal sets of rows (memo keys).
    pub fn fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }

    /// Splits a compact buffer of `width` values per row into one slice per head.
    pub fn split_heads<'a, T>(&self, mut compact: &'a mut [T], width: usize) -> Vec<&'a mut [T]> {
        assert_eq!(compact.len(), self.count() * width);
        let mut heads = Vec::with_capacity(self.heads());
        for bh in 0..self.heads() {
            let (head, rest) =
                compact.split_at_mut((self.offsets[bh + 1] - self.offsets[bh]) * width);
            heads.push(head);
            compact = rest;
        }
        heads
    }
}

/// The sampled rows of head `bh`, sorted and distinct.
fn head_rows(shape: &Shape, seed: u64, bh: usize, tiles: &[usize]) -> Vec<usize> {
    let s = shape.s;
    let mut rows = Vec::new();
    if shape.causal {
        // Row r sees r + 1 + S_k - S_q keys: the rows that see exactly k keys for k = 0 (the
        // last row that sees none), 1, 2 and every 64m, 64m + 1 (the diagonal at a KV tile's
        // edge: the last row whose diagonal tile is full, the first that starts a new one).
        let diag = shape.sk as i64 - s as i64;
        let counts = [0, 1, 2]
            .into_iter()
            .chain((64..=shape.sk + 1).step_by(64).flat_map(|k| [k, k + 1]));
        rows.extend(
            counts
                .map(|k| k as i64 - diag - 1)
                .filter(|&r| (0..s as i64).contains(&r))
                .map(|r| r as usize),
        );
    }
    for &t in tiles {
        rows.extend(0..t.min(s)); // the first tile
        rows.extend((s - 1) / t * t..s); // the last tile
        for edge in (t..s).step_by(t) {
            rows.extend([edge - 1, edge]);
        }
    }
    let mut h = Sha256::new();
    h.update(b"sdpa-runner rows v1");
    h.update(seed.to_le_bytes());
    h.update((bh as u64).to_le_bytes());
    let mut rng = ChaCha8Rng::from_seed(h.finalize().into());
    rows.extend((0..RANDOM_ROWS).map(|_| rng.random_range(0..s)));
    rows.sort_unstable();
    rows.dedup();
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(b: usize, h: usize, s: usize) -> Shape {
        Shape::parse_inline(&format!("{b}x{h}x{s}x64"))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn sampled_rows_hold_both_end_tiles_every_tile_edge_and_random_rows_of_the_seed() {
        let sh = shape(1, 2, 1000);
        let set = RowSet::sampled(&sh, 7, &[32]);
        assert!(!set.is_all());
        for bh in 0..2 {
            let rows = set.rows(bh);
            assert!((0..32).all(|r| rows.contains(&r)), "first tile");
            assert!(
                (992..1000).all(|r| rows.contains(&r)),
                "last (partial) tile"
            );
            for edge in (32..1000).step_by(32) {
                assert!(
                    rows.contains(&(edge - 1)) && rows.contains(&edge),
                    "edge {edge}"
                );
            }
            assert!(rows.windows(2).all(|w| w[0] < w[1]), "sorted, distinct");
            let structured = 32 + 8 + 2 * (1000 / 32 - 1) - 2;
            assert!(rows.len() > structured, "random rows beyond the structure");
        }
        assert_ne!(set.rows(0), set.rows(1), "each head draws its own rows");
        let again = RowSet::sampled(&sh, 7, &[32]);
        assert_eq!(again.fingerprint(), set.fingerprint());
        assert_ne!(
            RowSet::sampled(&sh, 8, &[32]).fingerprint(),
            set.fingerprint()
        );
    }

    #[test]
    fn causal_sampled_rows_hold_the_diagonals_tile_edges_and_the_first_rows_that_see_keys() {
        let sh = Shape::parse_inline("1x1x1000x64:sk=1100:causal")
            .unwrap()
            .unwrap();
        let set = RowSet::sampled(&sh, 3, &[32]);
        let rows = set.rows(0);
        // Row r sees r + 101 keys: 128 keys at row 27, 129 at 28, 1024 at 923, 1025 at 924.
        for r in [27, 28, 923, 924] {
            assert!(rows.contains(&r), "row {r}");
        }
        assert!(set.rule().contains("causal diagonal"));
        // S_q > S_k: rows 0..=199 see nothing; 199 is the last, 200 and 201 see 1 and 2 keys.
        let tall = Shape::parse_inline("1x1x5000x64:sk=4800:causal")
            .unwrap()
            .unwrap();
        let rows = RowSet::sampled(&tall, 3, &[32]).rows(0).into_owned();
        for r in [199, 200, 201, 263, 264] {
            assert!(rows.contains(&r), "row {r}");
        }
        assert!(rows.len() <= max_rows_per_head(CheckRows::Sampled, &tall));
    }

    #[test]
    fn tiles_that_follow_the_head_dim_stay_within_the_memory_bound() {
        // Three consumers at D 64 (192 rows) beside two at D 128 (128): the first and last
        // tile of each, and every edge of both, within the bound the memory check assumed.
        for s in [300, 1000, 4096] {
            let sh = shape(1, 1, s);
            let rows = RowSet::sampled(&sh, 0, &[192, 128]).rows(0).into_owned();
            assert!(
                rows.len() <= max_rows_per_head(CheckRows::Sampled, &sh),
                "S {s}"
            );
            // The widest tiles the runner accepts beside the narrowest (256 and 16 rows).
            assert_eq!((MAX_QUERY_TILE, MIN_QUERY_TILE), (256, 16));
            let extreme = RowSet::sampled(&sh, 0, &[256, 16]);
            assert!(
                extreme.rows(0).len() <= max_rows_per_head(CheckRows::Sampled, &sh),
                "S {s}"
            );
        }
    }

    #[test]
    fn every_tile_size_a_variant_launches_gets_its_edges() {
        let sh = shape(1, 1, 4096);
        let set = RowSet::sampled(&sh, 0, &[32, 48]);
        let rows = set.rows(0);
        for edge in [48 * 5, 32 * 77] {
            assert!(rows.contains(&(edge - 1)) && rows.contains(&edge));
        }
        assert!(
            rows.contains(&47) && rows.contains(&(85 * 48)),
            "both end tiles of 48"
        );
    }

    #[test]
    fn auto_checks_every_row_up_to_the_limit_and_samples_above_it() {
        let large = shape(1, 16, 4096); // exactly 2^28 scores
        assert!(RowSet::choose(CheckRows::Auto, &large, 0, &[32]).is_all());
        let longer = shape(1, 16, 8192);
        let set = RowSet::choose(CheckRows::Auto, &longer, 0, &[32]);
        assert!(!set.is_all() && set.count() < set.total() / 8);
        assert!(RowSet::choose(CheckRows::All, &longer, 0, &[32]).is_all());
        assert!(!RowSet::choose(CheckRows::Sampled, &large, 0, &[32]).is_all());
    }

    #[test]
    fn a_sample_that_covers_every_row_is_the_full_check() {
        // S = 40: the first tile (0..32) and the last (32..40) are every row.
        let set = RowSet::choose(CheckRows::Sampled, &shape(2, 2, 40), 0, &[32]);
        assert!(set.is_all());
        assert_eq!(set.rule(), "all");
    }

    #[test]
    fn each_pairs_every_checked_row_with_its_compact_row_head_by_head() {
        let sh = shape(2, 3, 3000);
        let set = RowSet::sampled(&sh, 1, &[32]);
        let mut expected = Vec::new();
        for bh in 0..6 {
            assert_eq!(set.offset(bh), expected.len());
            for &r in set.rows(bh).iter() {
                expected.push((bh * 3000 + r, expected.len()));
            }
        }
        assert_eq!(set.each().collect::<Vec<_>>(), expected);
        assert_eq!(expected.len(), set.count());
        let mut buf = vec![0u8; set.count() * 2];
        let heads = set.split_heads(&mut buf, 2);
        assert_eq!(heads[4].len(), set.rows(4).len() * 2);
        let all = RowSet::all(&sh);
        assert_eq!(
            (all.each().nth(3000 * 4 + 17), all.count()),
            (Some((12017, 12017)), 18000)
        );
    }
}
