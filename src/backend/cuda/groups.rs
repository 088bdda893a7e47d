//! What the runner's own kernels (the f64 references, the emulation) share: how they are
//! loaded (their launch geometry read from the constants they publish), and how they take a
//! problem's checked rows: heads in groups that fit a memory budget, the checked Q rows
//! gathered, and a table of row blocks, one per CTA: `(head within the group, first row,
//! rows)`, rows indexing the gathered Q rows (the compact layout of [`RowSet`]).

use std::ops::Range;
use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, DriverError};
use cudarc::nvrtc::Ptx;

use super::{identity, nvrtc};
use crate::rows::RowSet;

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

/// The row blocks of heads `heads`: per head, its checked rows `per_block` at a time, as
/// `(head - heads.start, first row within the group, rows)`.
pub fn row_blocks(rows: &RowSet, heads: Range<usize>, per_block: usize) -> Vec<i32> {
    let base = rows.offset(heads.start);
    let mut blocks = Vec::new();
    for bh in heads.clone() {
        let (first, n) = (rows.offset(bh) - base, rows.rows(bh).len());
        for start in (0..n).step_by(per_block) {
            let int = |x: usize| i32::try_from(x).expect("a head group's rows fit an int");
            blocks.extend([
                int(bh - heads.start),
                int(first + start),
                int(per_block.min(n - start)),
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
        // Heads 1 and 2, 2 rows per block: rows 0-1, 2-3, 4 of each, numbered from head 1.
        assert_eq!(
            row_blocks(&rows, 1..3, 2),
            [0, 0, 2, 0, 2, 2, 0, 4, 1, 1, 5, 2, 1, 7, 2, 1, 9, 1]
        );
    }
}
