//! How a launch's CTAs end on the GPU's SM slots, modeled, and the mixed launch it chooses
//! (docs/DESIGN.md "Kernel ABI", the mixed grid; docs/PERF.md "Stage D, change 37").
//!
//! The model is a greedy list schedule: the GPU starts a grid's CTAs in the order of their
//! linear index (x first), each on the slot (an SM, times the CTAs one SM holds) that frees
//! first, and a CTA of the entry's own tile takes time 1, one a unit shorter the manifest's
//! `cta_time`. A launch ends with its last CTA. Only the end is modeled, not the CTAs' speed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The most CTAs a plan models (a problem past it gains under a percent from its last wave).
const MAX_CTAS: u64 = 1 << 20;

/// A mixed launch is taken only where the model has it end at least this much sooner than the
/// unmixed one: the model knows two CTA times, not the GPU.
pub(super) const MIX_MARGIN: f64 = 0.02;

/// When the last of `jobs` (their times, in start order) ends on `slots` slots.
fn finish(jobs: impl Iterator<Item = f64>, slots: u32) -> f64 {
    // Times in millionths, so that the heap orders integers.
    let mut free: BinaryHeap<Reverse<u64>> = (0..slots.max(1)).map(|_| Reverse(0)).collect();
    let mut end = 0;
    for job in jobs {
        let Reverse(start) = free.pop().expect("at least one slot");
        let done = start + (job * 1e6).round() as u64;
        end = end.max(done);
        free.push(Reverse(done));
    }
    end as f64 / 1e6
}

/// An unmasked launch of `heads` heads of `units` units each, `n` units a CTA of the entry's
/// own tile, on `slots` slots, where a CTA of fewer units takes `short` of a full one's time.
#[derive(Debug, Clone, Copy)]
pub(super) struct Launch {
    pub units: u32,
    pub n: u32,
    pub heads: u32,
    pub slots: u32,
    pub short: f64,
}

impl Launch {
    /// The unmixed launch's end: the grid (query tiles, heads), a head's tiles side by side,
    /// its last tile of what units are left (a CTA of fewer than n taken as `short`).
    fn unmixed(&self) -> f64 {
        let tiles = self.units.div_ceil(self.n);
        let time = |x: u32| {
            if self.units - self.n * x >= self.n {
                1.0
            } else {
                self.short
            }
        };
        finish(
            (0..self.heads).flat_map(|_| (0..tiles).map(time)),
            self.slots,
        )
    }

    /// The end of a mixed launch of `tiles` query tiles a head on the grid (heads, tiles), every
    /// head's full CTAs first ([`mixed_units`]).
    fn mixed(&self, tiles: u32) -> f64 {
        let time = |y: u32| {
            if mixed_units(self.units, self.n, tiles, y).1 == self.n {
                1.0
            } else {
                self.short
            }
        };
        finish(
            (0..tiles).flat_map(|y| (0..self.heads).map(move |_| time(y))),
            self.slots,
        )
    }

    /// The query tiles a head of the mixed launch that ends soonest, where it ends at least
    /// [`MIX_MARGIN`] sooner than the unmixed one and than `rival` (another launch's end in
    /// the same unit, a full CTA's time: the narrower tile's, where the launch would take it)
    /// and its grid's y stays within `y_max`; None where none does (or the launch is past what
    /// the model takes: [`MAX_CTAS`]). A tie keeps the fewer tiles.
    pub(super) fn plan(&self, y_max: u32, rival: f64) -> Option<u32> {
        if self.n < 2 || self.units == 0 || self.heads == 0 {
            return None;
        }
        let unmixed_tiles = self.units.div_ceil(self.n);
        // Past a wave of more CTAs than the unmixed launch's, more tiles only add short CTAs
        // (and the model's cost with them).
        let most = (self.units / (self.n - 1))
            .min(unmixed_tiles + self.slots.div_ceil(self.heads) + 1)
            .min(y_max);
        if u64::from(self.heads) * u64::from(most) > MAX_CTAS {
            return None;
        }
        let unmixed = self.unmixed().min(rival);
        let mut best: Option<(f64, u32)> = None;
        for tiles in unmixed_tiles + 1..=most {
            let end = self.mixed(tiles);
            if best.is_none_or(|(b, _)| end < b) {
                best = Some((end, tiles));
            }
        }
        best.filter(|&(end, _)| end <= unmixed * (1.0 - MIX_MARGIN))
            .map(|(_, tiles)| tiles)
    }
}

/// The first unit and the units of query tile `y` of a head of `units` units in a mixed launch
/// of `tiles` tiles of n units: the first W = units - (n - 1) tiles own n, the rest n - 1
/// (cuda/sdpa_fp8_stage_d_wgmma.cu `cta_work`: tile y >= W starts at n y - (y - W)).
fn mixed_units(units: u32, n: u32, tiles: u32, y: u32) -> (u32, u32) {
    let wide = units - (n - 1) * tiles;
    if y < wide {
        (n * y, n)
    } else {
        (n * y - (y - wide), n - 1)
    }
}

/// A causal launch's CTAs: `heads` heads of `sq` query rows and `sk` keys (bottom-right aligned),
/// started as the kernels order them: with `heads_first` every head's last query tile, then
/// every head's one before, down to the first (launch.rs `Order::HeadsFirst`); else each head's
/// tiles from its last, head after head. A CTA's time is its KV tiles of `block_n` keys (the
/// tiles up to its last row's last key) times a KV tile's time in its tile.
#[derive(Debug, Clone, Copy)]
pub(super) struct Causal {
    pub heads: u32,
    pub sq: u32,
    pub sk: u32,
    pub block_n: u32,
    pub heads_first: bool,
}

impl Causal {
    /// When the launch of query tiles of `rows` rows ends on `slots` slots, a KV tile taking
    /// `per_tile` (the entry's own tile's is 1); None past what the model takes ([`MAX_CTAS`]).
    pub(super) fn end(&self, rows: u32, per_tile: f64, slots: u32) -> Option<f64> {
        let tiles = self.sq.div_ceil(rows.max(1));
        if u64::from(self.heads) * u64::from(tiles) > MAX_CTAS {
            return None;
        }
        let time = |m: u32| {
            let end = (u64::from(m) + 1) * u64::from(rows) + u64::from(self.sk);
            let keys = end
                .saturating_sub(u64::from(self.sq))
                .min(u64::from(self.sk));
            keys.div_ceil(u64::from(self.block_n.max(1))) as f64 * per_tile
        };
        let last = |i: u32| time(tiles - 1 - i);
        Some(if self.heads_first {
            finish(
                (0..tiles).flat_map(|y| (0..self.heads).map(move |_| last(y))),
                slots,
            )
        } else {
            finish((0..self.heads).flat_map(|_| (0..tiles).map(last)), slots)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stage D's D 64 entry on an H100: 192-row CTAs (3 units of 64), one an SM, a CTA of
    /// two units `short` of a full one's time (the tests' own figures; the manifest's is 0.88).
    fn d64(b: u32, h: u32, sq: u32, short: f64) -> Launch {
        Launch {
            units: sq.div_ceil(64),
            n: 3,
            heads: b * h,
            slots: 132,
            short,
        }
    }

    #[test]
    fn a_mixed_launchs_tiles_cover_every_unit_once_full_ones_first() {
        // Every grid the host may choose: T from one past the unmixed tiles to units / (n - 1).
        for n in [2u32, 3] {
            for units in 1..=200u32 {
                for tiles in units.div_ceil(n) + 1..=units / (n - 1) {
                    let mut next = 0;
                    let mut shorter = false;
                    for y in 0..tiles {
                        let (first, count) = mixed_units(units, n, tiles, y);
                        assert_eq!(first, next, "n {n} units {units} tiles {tiles} y {y}");
                        assert!(count == n || count == n - 1);
                        assert!(
                            !shorter || count == n - 1,
                            "a full tile after a shorter one"
                        );
                        shorter |= count == n - 1;
                        next += count;
                    }
                    assert_eq!(next, units, "n {n} units {units} tiles {tiles}");
                    assert!(shorter, "a mixed launch has a shorter tile");
                }
            }
        }
    }

    #[test]
    fn the_list_schedule_ends_with_its_last_slot() {
        // 264 equal CTAs on 132 slots: two waves; one more: three.
        assert_eq!(finish(std::iter::repeat_n(1.0, 264), 132), 2.0);
        assert_eq!(finish(std::iter::repeat_n(1.0, 265), 132), 3.0);
        // Short jobs fill the slots the long ones leave (1 + 0.5 + 0.5 beside 2); a long job last
        // ends late (2 after 1 = 0.5 + 0.5).
        assert_eq!(finish([2.0, 1.0, 0.5, 0.5].into_iter(), 2), 2.0);
        assert_eq!(finish([1.0, 0.5, 0.5, 2.0].into_iter(), 2), 3.0);
    }

    #[test]
    fn a_last_wave_of_full_ctas_on_few_sms_is_mixed_with_shorter_ones() {
        // 1x16x4096x64: 22 tiles a head, 352 CTAs, 2.67 waves (3 ends). 24 tiles, 16 of three
        // units and 8 of two: 256 full CTAs, then 128 short ones on the 132 slots.
        let l = d64(1, 16, 4096, 0.89);
        assert_eq!(l.unmixed(), 3.0);
        assert!((l.mixed(24) - 2.89).abs() < 1e-9, "{}", l.mixed(24));
        assert_eq!(l.plan(65535, f64::INFINITY), Some(24));
        // Every wave full already (1x12x4096: 264 CTAs), or a short CTA as slow as a full one:
        // nothing to gain.
        assert_eq!(d64(1, 12, 4096, 0.89).plan(65535, f64::INFINITY), None);
        assert_eq!(d64(1, 16, 4096, 1.0).plan(65535, f64::INFINITY), None);
        // 4x16x4096: 10.67 waves; mixing adds more short CTAs than it saves.
        assert_eq!(d64(4, 16, 4096, 0.89).plan(65535, f64::INFINITY), None);
    }

    #[test]
    fn a_narrower_tile_that_ends_sooner_still_is_not_mixed_away() {
        // 1x16x4096x64 mixed ends at 2.89; a rival launch at 2.9 is within the margin, one at
        // 3.0 is not.
        let l = d64(1, 16, 4096, 0.89);
        assert_eq!(l.plan(65535, 2.9), None);
        assert_eq!(l.plan(65535, 3.0), Some(24));
    }

    #[test]
    fn a_causal_launch_ends_with_its_heaviest_ctas_spread_first() {
        let c = |h, sq| Causal {
            heads: h,
            sq,
            sk: sq,
            block_n: 128,
            heads_first: true,
        };
        // 1x16x4096 at D 128: 22 tiles of 192 rows a head (the last runs 32 KV tiles) against
        // 32 of 128 rows at 0.76 a KV tile: the narrower ends sooner; with 32 heads the wider.
        let (wide, narrow) = (
            c(16, 4096).end(192, 1.0, 132),
            c(16, 4096).end(128, 0.76, 132),
        );
        assert_eq!(wide, Some(50.0));
        assert!((narrow.unwrap() - 49.4).abs() < 1e-9, "{narrow:?}");
        let (wide, narrow) = (
            c(32, 4096).end(192, 1.0, 132),
            c(32, 4096).end(128, 0.76, 132),
        );
        assert_eq!((wide, narrow.map(|n| n.round())), (Some(94.0), Some(98.0)));
        // One head of one tile: its KV tiles (S_k 300 past S_q 77: all 300 keys, 3 tiles).
        let one = Causal {
            heads: 1,
            sq: 77,
            sk: 300,
            block_n: 128,
            heads_first: true,
        };
        assert_eq!(one.end(192, 1.0, 132), Some(3.0));
        // Head after head, each from its last: the last head's heaviest CTA starts late.
        let tiles_first = Causal {
            heads_first: false,
            ..c(16, 4096)
        };
        assert!(tiles_first.end(192, 1.0, 132).unwrap() > 55.0);
        let huge = Causal {
            heads: 1 << 20,
            ..c(16, 4096)
        };
        assert_eq!(huge.end(192, 1.0, 132), None);
    }

    #[test]
    fn a_gain_under_the_margin_keeps_the_unmixed_launch() {
        // 1x16x16384x64: 86 tiles a head, 10.4 waves; 87 tiles end 1% sooner (0.89).
        let l = d64(1, 16, 16384, 0.89);
        assert!(l.mixed(87) < l.unmixed());
        assert!(l.mixed(87) > l.unmixed() * (1.0 - MIX_MARGIN));
        assert_eq!(l.plan(65535, f64::INFINITY), None);
    }

    #[test]
    fn a_mixed_grid_stays_within_its_y_limit_and_the_models_reach() {
        let l = d64(1, 16, 4096, 0.89);
        assert_eq!(
            l.plan(23, f64::INFINITY),
            None,
            "24 tiles past a limit of 23"
        );
        let two_units = Launch { n: 1, ..l };
        assert_eq!(
            two_units.plan(65535, f64::INFINITY),
            None,
            "a CTA of one unit has none to spare"
        );
        let huge = Launch {
            heads: 1 << 14,
            units: 1 << 10,
            ..l
        };
        assert_eq!(huge.plan(65535, f64::INFINITY), None);
    }
}
