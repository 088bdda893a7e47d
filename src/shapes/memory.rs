//! Whether a run's problems fit the host's memory, refused before any work when not.

use super::Shape;
use crate::usage::ConfigError;

impl Shape {
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
    use crate::shapes::catalog::sample_catalog;

    #[test]
    fn a_shape_too_large_for_memory_is_refused_with_the_size_it_needs() {
        let shapes = sample_catalog().select("64x64x65536x64").unwrap();
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
                &sample_catalog().select("small").unwrap(),
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
        let big = sample_catalog().select("128x16x16384x64").unwrap();
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
        let big = sample_catalog().select("128x16x16384x64").unwrap();
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
        two.extend(sample_catalog().select("small").unwrap());
        assert!(check_host_memory(&two, rows, Some(64 << 30), 2, 1, 16).is_ok());
    }

    #[test]
    fn each_worker_counts_the_scratch_of_its_own_threads_only() {
        // 1x1x65536x64, every row: 335 MB of scratch per thread and 0.31 GB of the rest per
        // problem; two workers hold a problem each.
        let long = sample_catalog().select("1x1x65536x64").unwrap();
        let rows = |s: &Shape| s.s;
        let per_thread = 65536.0 * (6.0 * 64.0 * 8.0 + 2048.0);
        let avail = (0.7e9 + 2.0 * 16.0 * per_thread) as u64;
        let fits = |threads| check_host_memory(&long, rows, Some(avail), 2, 2, threads);
        assert!(fits(16).is_ok(), "two workers of 16 threads fit");
        assert!(fits(32).is_err(), "two workers of 32 threads do not");
    }
}
