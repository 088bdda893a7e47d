//! What the runner's own kernels (the f64 references, the emulation) share: how they are
//! loaded (their launch geometry read from the constants they publish), and how they take a
//! problem's checked rows: query heads in groups that fit a memory budget with the K/V heads
//! they read, the checked Q rows gathered with the keys each sees, and a table of row blocks,
//! one per CTA: `(query head, K/V head, first row, rows, keys)`, heads numbered within the
//! group, rows indexing the gathered Q rows (the compact layout of [`RowSet`]), keys the most
//! any of the block's rows sees.

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, DriverError};
use cudarc::nvrtc::Ptx;

use super::{identity, nvrtc};
use crate::rows::RowSet;
use crate::shapes::Shape;

/// One of the runner's own kernels, compiled: `what` names it in messages.
pub struct OwnKernel<'a> {
    pub what: &'a str,
    pub compiled: nvrtc::Compiled,
}

impl OwnKernel<'_> {
    /// The `int` constant `name` the kernel publishes.
    pub fn constant(&self, name: &str) -> Result<u32, String> {
        identity::ptx_constant(&self.compiled.ptx, name)
            .map_err(|e| format!("the {}: {e}", self.what))
    }

    /// Loads its module and `entry`, allowing it `smem_bytes` of dynamic shared memory.
    pub fn load(
        self,
        ctx: &Arc<CudaContext>,
        entry: &str,
        smem_bytes: u32,
    ) -> Result<(Arc<CudaModule>, CudaFunction), String> {
        let failed = |e: DriverError| format!("loading the {} failed: {e}", self.what);
        let module = ctx
            .load_module(Ptx::from_binary(self.compiled.cubin))
            .map_err(failed)?;
        let function = module.load_function(entry).map_err(failed)?;
        function
            .set_attribute(
                FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem_bytes as i32,
            )
            .map_err(failed)?;
        Ok((module, function))
    }
}

/// Heads `0..heads` in consecutive groups of at most `group_bytes` each, `bytes(bh)` being
/// what head `bh` needs; a head that needs more is a group of its own.
pub fn head_groups(
    heads: usize,
    group_bytes: u64,
    bytes: impl Fn(usize) -> u64,
) -> Vec<Range<usize>> {
    let mut groups = Vec::new();
    let mut first = 0;
    while first < heads {
        let mut end = first + 1;
        let mut total = bytes(first);
        while end < heads && total + bytes(end) <= group_bytes {
            total += bytes(end);
            end += 1;
        }
        groups.push(first..end);
        first = end;
    }
    groups
}

/// The `d`-element rows of `full` (`[heads, s, d]`) that `rows` checks in heads `heads`, in
/// the compact layout.
pub fn gather<T: Copy>(
    full: &[T],
    rows: &RowSet,
    heads: Range<usize>,
    s: usize,
    d: usize,
) -> Vec<T> {
    let span = rows.offset(heads.start)..rows.offset(heads.end);
    let mut out = Vec::with_capacity(span.len() * d);
    for bh in heads {
        for &r in rows.rows(bh).iter() {
            out.extend_from_slice(&full[(bh * s + r) * d..][..d]);
        }
    }
    out
}

/// Ints per row block in the table the runner's kernels read.
pub const BLOCK_INTS: usize = 5;

fn int(x: usize) -> i32 {
    i32::try_from(x).expect("a head group's rows and keys fit an int (shapes are checked)")
}

/// The K/V heads query heads `heads` of a problem of `shape` read: a contiguous range.
pub fn kv_heads(shape: &Shape, heads: Range<usize>) -> Range<usize> {
    if heads.is_empty() {
        return 0..0;
    }
    shape.kv_head_of(heads.start)..shape.kv_head_of(heads.end - 1) + 1
}

/// The keys each checked row of heads `heads` sees ([`Shape::visible_keys`]), in the compact
/// layout.
pub fn visible_keys(shape: &Shape, rows: &RowSet, heads: Range<usize>) -> Vec<i32> {
    let mut keys = Vec::new();
    for bh in heads {
        keys.extend(rows.rows(bh).iter().map(|&r| int(shape.visible_keys(r))));
    }
    keys
}

/// The row blocks of query heads `heads` of a problem of `shape`: per head, its checked rows
/// `per_block` at a time, as `(head - heads.start, its K/V head - the group's first, first row
/// within the group, rows, the most keys any of them sees)`.
pub fn row_blocks(shape: &Shape, rows: &RowSet, heads: Range<usize>, per_block: usize) -> Vec<i32> {
    let base = rows.offset(heads.start);
    let kv_base = kv_heads(shape, heads.clone()).start;
    let mut blocks = Vec::new();
    for bh in heads.clone() {
        let (first, mine) = (rows.offset(bh) - base, rows.rows(bh));
        for (start, block) in (0..).step_by(per_block).zip(mine.chunks(per_block)) {
            let keys = block.iter().map(|&r| shape.visible_keys(r)).max();
            blocks.extend([
                int(bh - heads.start),
                int(shape.kv_head_of(bh) - kv_base),
                int(first + start),
                int(block.len()),
                int(keys.unwrap_or(0)),
            ]);
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapes::Shape;

    fn shape(h: usize, s: usize) -> Shape {
        Shape {
            name: "t".into(),
            b: 1,
            h,
            s,
            d: 64,
            qk_std: 1.0,
            purpose: String::new(),
            dist: Default::default(),
            rotate: false,
            hkv: h,
            sk: s,
            causal: false,
        }
    }

    #[test]
    fn heads_are_grouped_greedily_within_the_budget_and_at_least_one_per_group() {
        let one = 1000;
        let groups = |budget| head_groups(5, budget, |_| one);
        let all = groups(u64::MAX);
        assert_eq!((all.len(), all[0].clone()), (1, 0..5));
        assert_eq!(groups(1), [0..1, 1..2, 2..3, 3..4, 4..5]);
        assert_eq!(groups(2 * one), [0..2, 2..4, 4..5]);
        assert_eq!(groups(3 * one - 1), [0..2, 2..4, 4..5]);
        assert_eq!(groups(3 * one), [0..3, 3..5]);
        assert_eq!(head_groups(3, 10, |bh| [4, 7, 3][bh]), [0..1, 1..3]);
    }

    #[test]
    fn gathered_rows_and_row_blocks_follow_the_compact_layout() {
        let sh = shape(3, 5);
        let rows = RowSet::all(&sh);
        let full: Vec<usize> = (0..3 * 5 * 2).collect();
        assert_eq!(
            gather(&full, &rows, 1..3, 5, 2),
            (10..30).collect::<Vec<_>>()
        );
        // Heads 1 and 2, 2 rows per block: rows 0-1, 2-3, 4 of each, numbered from head 1;
        // each its own K/V head, every row seeing all 5 keys.
        assert_eq!(
            row_blocks(&sh, &rows, 1..3, 2),
            [
                0, 0, 0, 2, 5, 0, 0, 2, 2, 5, 0, 0, 4, 1, 5, 1, 1, 5, 2, 5, 1, 1, 7, 2, 5, 1, 1, 9,
                1, 5
            ]
        );
    }

    #[test]
    fn row_blocks_name_the_kv_head_each_query_head_reads_and_the_most_keys_a_row_sees() {
        // 2 batches of 4 query heads over 2 K/V heads; 6 queries against 10 keys, causal
        // (bottom-right: row i sees i + 5 keys).
        let sh = Shape {
            b: 2,
            hkv: 2,
            sk: 10,
            causal: true,
            ..shape(4, 6)
        };
        let rows = RowSet::all(&sh);
        // Query heads 3..7: batch 0 head 3 (K/V head 1), batch 1 heads 0-2 (K/V heads 2, 2, 3).
        assert_eq!(kv_heads(&sh, 3..7), 1..4);
        let blocks = row_blocks(&sh, &rows, 3..7, 4);
        let table: Vec<&[i32]> = blocks.chunks(BLOCK_INTS).collect();
        assert_eq!(table.len(), 8);
        assert_eq!(table[0], [0, 0, 0, 4, 8]);
        assert_eq!(table[1], [0, 0, 4, 2, 10]);
        assert_eq!(table[2], [1, 1, 6, 4, 8]);
        assert_eq!(table[5], [2, 1, 16, 2, 10]);
        assert_eq!(table[6], [3, 2, 18, 4, 8]);
        assert_eq!(visible_keys(&sh, &rows, 3..4), [5, 6, 7, 8, 9, 10]);
        assert_eq!(kv_heads(&sh, 0..0), 0..0);
    }
}
