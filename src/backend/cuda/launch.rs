//! Device buffers of one problem and the kernel launch (docs/DESIGN.md "Kernel ABI"): Q, K and V
//! as pointers, as tensor maps (`abi = "tensor-maps"`, src/backend/cuda/tensor_map.rs), or as
//! pointers with K's and V's maps in device memory (`"pointers-and-kv-maps"`), as the variant's
//! manifest entry says.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DriverError, LaunchConfig,
    PushKernelArg,
};
use half::f16;

use super::LoadedVariant;
use super::identity::{KernelConstants, LaunchShape};
use super::tensor_map::{self, MapLayout, Operand, TmaDesc};
use crate::kernels::{Abi, NarrowTile};
use crate::metrics::POISON;
use crate::problem::Problem;

/// Inputs and output of one problem on the device.
pub struct DeviceProblem {
    q: CudaSlice<u8>,
    k: CudaSlice<u8>,
    v: CudaSlice<u8>,
    q_scale: CudaSlice<f32>,
    k_scale: CudaSlice<f32>,
    v_scale: CudaSlice<f32>,
    /// Output buffers: one, or two for concurrent launches on two streams.
    outs: Vec<CudaSlice<f16>>,
    b: i32,
    h: i32,
    hkv: i32,
    sq: i32,
    sk: i32,
    causal: i32,
    entry: crate::shapes::Entry,
    /// The problem as the launch geometry reads it (the i32 fields above are the kernel's
    /// arguments).
    shape: LaunchShape,
    softmax_scale: f32,
    /// The Q, K and V tensor maps of each layout a `tensor-maps` variant asked for, built at
    /// its first launch.
    maps: Vec<(MapLayout, [TmaDesc; 3])>,
    /// K's and V's maps of each layout a `pointers-and-kv-maps` variant asked for, in device
    /// memory (the kernel takes their address: 8 bytes of arguments, not 256).
    kv_maps: Vec<(MapLayout, CudaSlice<TmaDesc>)>,
    /// The launch geometry of each function that launched it (a function is one variant's
    /// entry: its module's constants, its manifest entry and its GPU go with it).
    geometries: Vec<(CUfunctionKey, Geometry)>,
    /// A split launch's workspace per output buffer (zeroed once; the kernel leaves its
    /// counters zero), so launches on two streams never share one.
    works: Vec<Option<CudaSlice<u8>>>,
}

/// A loaded function's handle, as the key of its geometry.
type CUfunctionKey = usize;

/// Which of an entry's query tiles a launch runs.
#[derive(Debug, Clone, Copy)]
pub(super) enum TileChoice {
    /// The one `QueryTile::choose` picked: every timed launch's.
    Chosen,
    /// The other, for the check that both give the same bits.
    Other,
}

/// What one module's launches of this problem need beyond its buffers.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    tile: QueryTile,
    /// The chosen tile's grid: a mixed launch's query tiles a head, or its own order.
    order: Order,
    /// The other query tile the entry runs (the one not chosen), where it runs two.
    other: Option<QueryTile>,
    smem_bytes: u32,
    kv_ctas: u32,
    /// Bytes of the split's workspace (0: no split).
    work_bytes: usize,
}

impl DeviceProblem {
    /// Device bytes a problem needs: three code tensors, three scale vectors, the f16 output,
    /// and for a short query the bound of two split workspaces (one per output buffer).
    pub fn bytes_needed(p: &Problem) -> u64 {
        let n = p.output_len() as u64;
        let nkv = p.shape.kv_elements().unwrap_or(usize::MAX) as u64;
        let split = if p.shape.s <= SPLIT_MAX_ROWS {
            2 * SPLIT_WORK_BOUND + 2 * 4 * p.shape.heads() as u64
        } else {
            0
        };
        n + 2 * nkv + 2 * n + 4 * (p.shape.heads() + 2 * p.shape.kv_heads()) as u64 + split
    }

    pub fn upload(stream: &Arc<CudaStream>, p: &Problem) -> Result<Self, DriverError> {
        Ok(DeviceProblem {
            q: stream.clone_htod(&p.q.codes)?,
            k: stream.clone_htod(&p.k.codes)?,
            v: stream.clone_htod(&p.v.codes)?,
            q_scale: stream.clone_htod(&p.q.scales)?,
            k_scale: stream.clone_htod(&p.k.scales)?,
            v_scale: stream.clone_htod(&p.v.scales)?,
            outs: vec![unsafe { stream.alloc::<f16>(p.output_len())? }],
            b: p.shape.b as i32,
            h: p.shape.h as i32,
            hkv: p.shape.hkv as i32,
            sq: p.shape.s as i32,
            sk: p.shape.sk as i32,
            causal: i32::from(p.shape.causal),
            entry: p.shape.entry(),
            shape: LaunchShape::of(&p.shape),
            softmax_scale: p.softmax_scale,
            maps: Vec::new(),
            kv_maps: Vec::new(),
            geometries: Vec::new(),
            works: Vec::new(),
        })
    }

    /// The Q, K, V tensor maps over this problem's codes in `layout` (built once per layout,
    /// at the first call: `CudaBackend::load` builds them before any launch).
    pub fn tensor_maps(
        &mut self,
        stream: &Arc<CudaStream>,
        layout: MapLayout,
    ) -> Result<[TmaDesc; 3], String> {
        if let Some((_, maps)) = self.maps.iter().find(|(l, _)| *l == layout) {
            return Ok(*maps);
        }
        let (d, q) = (self.entry.d, self.shape);
        let (sq, sk) = (q.sq, q.sk);
        let (heads, kv_heads) = (q.b * q.h, q.b * q.hkv);
        let addr = |s: &CudaSlice<u8>| {
            let (ptr, _sync) = s.device_ptr(stream);
            ptr
        };
        let maps = [
            tensor_map::encode(Operand::Q, addr(&self.q), d, sq, heads, layout)?,
            tensor_map::encode(Operand::K, addr(&self.k), d, sk, kv_heads, layout)?,
            tensor_map::encode(Operand::V, addr(&self.v), d, sk, kv_heads, layout)?,
        ];
        self.maps.push((layout, maps));
        Ok(maps)
    }

    /// K's and V's tensor maps in `layout`, copied to device memory once per layout (the
    /// `pointers-and-kv-maps` ABI's last argument: the kernel reads them there).
    pub fn kv_maps(
        &mut self,
        stream: &Arc<CudaStream>,
        layout: MapLayout,
    ) -> Result<&CudaSlice<TmaDesc>, String> {
        if let Some(i) = self.kv_maps.iter().position(|(l, _)| *l == layout) {
            return Ok(&self.kv_maps[i].1);
        }
        let [_, k, v] = self.tensor_maps(stream, layout)?;
        let on_device = stream
            .clone_htod(&[k, v])
            .map_err(|e| format!("copying K's and V's tensor maps to the GPU: {e}"))?;
        self.kv_maps.push((layout, on_device));
        Ok(&self.kv_maps.last().expect("just pushed").1)
    }

    /// Makes sure `count` output buffers exist.
    pub fn ensure_outputs(
        &mut self,
        stream: &Arc<CudaStream>,
        count: usize,
    ) -> Result<(), DriverError> {
        while self.outs.len() < count {
            let len = self.outs[0].len();
            self.outs.push(unsafe { stream.alloc::<f16>(len)? });
        }
        Ok(())
    }

    /// Fills output `slot` with the poison pattern, so unwritten elements are detectable.
    pub fn poison(&mut self, stream: &Arc<CudaStream>, slot: usize) -> Result<(), DriverError> {
        let out = &mut self.outs[slot];
        let len = out.len();
        let (ptr, _sync) = out.device_ptr_mut(stream);
        unsafe {
            cudarc::driver::sys::cuMemsetD16Async(ptr, POISON.to_bits(), len, stream.cu_stream())
        }
        .result()
    }

    /// Enqueues one launch of `function` on `stream` writing output `slot` (asynchronous;
    /// errors of the launch itself are returned, faults surface at the next synchronization).
    pub fn launch(
        &mut self,
        stream: &Arc<CudaStream>,
        variant: &LoadedVariant,
        slot: usize,
    ) -> Result<(), DriverError> {
        self.launch_at(stream, variant, slot, TileChoice::Chosen)
            .map(|_| ())
    }

    /// The geometry [`DeviceProblem::launch`] gives `variant`'s launches (None where the driver
    /// could not say how many of its CTAs an SM holds: then no launch was made either).
    pub fn chosen_launch(
        &mut self,
        variant: &LoadedVariant,
    ) -> Option<crate::schema::LaunchRecord> {
        let g = self.geometry(variant).ok()?;
        let (grid, block) = launch_dims(g.tile, self.shape, g.kv_ctas, g.order);
        Some(crate::schema::LaunchRecord {
            query_rows: g.tile.rows,
            threads: block.0,
            grid: [grid.0, grid.1, grid.2],
            function: Some(variant.function_name(self.entry, g.tile.rows)),
        })
    }

    /// As [`DeviceProblem::launch`], at the query tile `which`: the chosen one, or the one
    /// the launch did not choose where the entry runs two (false, and nothing launched, where
    /// it runs one), which must give the same bits.
    pub(super) fn launch_at(
        &mut self,
        stream: &Arc<CudaStream>,
        variant: &LoadedVariant,
        slot: usize,
        which: TileChoice,
    ) -> Result<bool, DriverError> {
        let geometry = self.geometry(variant)?;
        let consts = &variant.identity.constants;
        let (tile, order) = match which {
            TileChoice::Chosen => (geometry.tile, geometry.order),
            TileChoice::Other => match geometry.other {
                Some(t) => (t, Order::of(self.heads_first(variant))),
                None => return Ok(false),
            },
        };
        let function = self.function(variant, tile.rows);
        let (grid_dim, block_dim) = launch_dims(tile, self.shape, geometry.kv_ctas, order);
        let cfg = LaunchConfig {
            grid_dim,
            block_dim,
            shared_mem_bytes: geometry.smem_bytes,
        };
        let work = self.work(stream, slot, geometry.work_bytes)?;
        let abi = variant.kernel.abi;
        let refused = |why: String| {
            crate::trace::mark(|| why.clone());
            DriverError(cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE)
        };
        let maps = match abi {
            Abi::TensorMaps => Some(
                self.tensor_maps(stream, consts.map_layout())
                    .map_err(refused)?,
            ),
            Abi::Pointers | Abi::PointersAndKvMaps => None,
        };
        if abi == Abi::PointersAndKvMaps {
            self.kv_maps(stream, consts.map_layout()).map_err(refused)?;
        }
        let layout = consts.map_layout();
        let kv_maps = (abi == Abi::PointersAndKvMaps).then(|| {
            let (_, on_device) = self
                .kv_maps
                .iter()
                .find(|(l, _)| *l == layout)
                .expect("built just above");
            on_device
        });
        // The argument order of cuda/kernels.toml's `abi` (checked against each entry's PTX
        // parameters when the module is built: kernel.rs `abi_mismatch`).
        let mut args = stream.launch_builder(function);
        match &maps {
            Some([q, k, v]) => args.arg(q).arg(k).arg(v),
            None => args.arg(&self.q).arg(&self.k).arg(&self.v),
        };
        args.arg(&self.q_scale)
            .arg(&self.k_scale)
            .arg(&self.v_scale)
            .arg(&mut self.outs[slot])
            .arg(&self.b)
            .arg(&self.h)
            .arg(&self.hkv)
            .arg(&self.sq)
            .arg(&self.sk)
            .arg(&self.causal)
            .arg(&self.softmax_scale);
        if abi != Abi::TensorMaps {
            args.arg(&work);
        }
        if let Some(on_device) = kv_maps {
            args.arg(on_device);
        }
        unsafe { args.launch(cfg) }.map(|_| true)
    }

    /// Whether `variant`'s launches of this problem put the heads on the grid's x
    /// ([`launch_dims`]).
    fn heads_first(&self, variant: &LoadedVariant) -> bool {
        heads_first(self.entry, &variant.identity.constants)
    }

    /// The function of this problem's entry (D, causal) in `variant` that runs query tiles of
    /// `rows` rows: the entry's companion of those rows, or the entry's own
    /// ([`LoadedVariant::function`]; `CudaBackend::load` refused a problem whose entry was not
    /// built).
    fn function<'v>(&self, variant: &'v LoadedVariant, rows: u32) -> &'v CudaFunction {
        variant
            .function(self.entry, rows)
            .expect("the entry of the problem was built")
    }

    /// The launch geometry of `variant` on this problem: its module's constants, the narrower
    /// tile its manifest names, its GPU's SMs and the driver's occupancy of its function (which
    /// its registers set), worked out at its first launch of this problem (not in every timed
    /// launch).
    fn geometry(&mut self, variant: &LoadedVariant) -> Result<Geometry, DriverError> {
        let entry_fn = variant
            .entry(self.entry)
            .expect("the entry of the problem was built");
        let key = entry_fn.cu_function() as CUfunctionKey;
        if let Some((_, g)) = self.geometries.iter().find(|(k, _)| *k == key) {
            return Ok(*g);
        }
        let (consts, sms) = (&variant.identity.constants, variant.sms);
        let shape = self.shape;
        let kv_ctas = consts.kv_ctas(self.entry, shape);
        let smem_bytes = consts.launch_smem_bytes(self.entry, shape, sms);
        let occupancy = |tile: QueryTile| {
            self.function(variant, tile.rows)
                .occupancy_max_active_blocks_per_multiprocessor(
                    tile.threads,
                    smem_bytes as usize,
                    None,
                )
        };
        let Plan { tile, other, order } = plan_launch(
            consts,
            self.entry,
            shape,
            kv_ctas,
            &variant.kernel.tiles,
            sms,
            occupancy,
        )?;
        crate::trace::mark(|| {
            format!(
                "launch {}: {} query rows a CTA, {} threads, {} bytes of shared memory, \
                 the keys of a query tile over {} CTAs, function {}{}",
                self.entry.suffix(),
                tile.rows,
                tile.threads,
                smem_bytes,
                kv_ctas,
                variant.function_name(self.entry, tile.rows),
                match order {
                    Order::Mixed(t) => format!(", mixed: {t} query tiles a head"),
                    _ => String::new(),
                }
            )
        });
        let g = Geometry {
            tile,
            order,
            other,
            smem_bytes,
            kv_ctas,
            work_bytes: if kv_ctas > 1 {
                split_work_bytes(shape, self.entry.d, consts.kv_split * kv_ctas)
            } else {
                0
            },
        };
        self.geometries.push((key, g));
        Ok(g)
    }

    /// The device address of output `slot`'s split workspace of at least `bytes` (zeroed when
    /// allocated), or 0 where the launch does not split.
    fn work(
        &mut self,
        stream: &Arc<CudaStream>,
        slot: usize,
        bytes: usize,
    ) -> Result<u64, DriverError> {
        if bytes == 0 {
            return Ok(0);
        }
        if self.works.len() <= slot {
            self.works.resize_with(slot + 1, || None);
        }
        let fits = self.works[slot].as_ref().is_some_and(|w| w.len() >= bytes);
        if !fits {
            self.works[slot] = Some(stream.alloc_zeros::<u8>(bytes)?);
        }
        let work = self.works[slot].as_ref().expect("allocated above");
        let (ptr, _sync) = work.device_ptr(stream);
        Ok(ptr)
    }

    pub fn download(&self, stream: &Arc<CudaStream>, slot: usize) -> Result<Vec<f16>, DriverError> {
        stream.clone_dtoh(&self.outs[slot])
    }
}

/// The query rows of one CTA and its threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QueryTile {
    rows: u32,
    threads: u32,
}

impl QueryTile {
    /// When a launch of this tile ends in the model of [`QueryTile::choose`]: its whole waves
    /// of CTAs on `slots` times a CTA's `cta_time` (the entry's own tile's CTA is 1).
    fn time(self, slots: u32, cta_time: f64, sq: u32, ctas: u32) -> f64 {
        let all = u64::from(sq.div_ceil(self.rows)) * u64::from(ctas);
        all.div_ceil(u64::from(slots.max(1))) as f64 * cta_time
    }

    /// The entry's own (a module may publish D 128's apart).
    fn own(consts: &KernelConstants, entry: crate::shapes::Entry) -> Self {
        QueryTile {
            rows: consts.block_m_of(entry),
            threads: consts.threads_of(entry),
        }
    }

    /// The manifest's narrower tile and its CTA time, where the entry runs it (where it does
    /// not, the build warned: kernel.rs `narrow_not_run`).
    fn narrow(
        consts: &KernelConstants,
        entry: crate::shapes::Entry,
        n: NarrowTile,
    ) -> Option<(Self, f64)> {
        let threads = consts.narrowed(entry, n.rows)?;
        Some((
            QueryTile {
                rows: n.rows,
                threads,
            },
            n.cta_time,
        ))
    }

    /// The tile whose CTAs end sooner on `sq` query rows, with `ctas` CTAs (query heads times
    /// KV split) per query tile: each tile's whole waves (its CTAs over `slots`, the SMs times
    /// the CTAs one SM holds at once) times its CTA's time, the entry's own 1 and the narrower
    /// `cta_time`; a tie keeps the entry's own. The model and the manifest's time are checked
    /// against both tiles measured on fifteen problems (docs/PERF.md change 23).
    fn choose(own: (Self, u32), narrow: (Self, u32, f64), sq: u32, ctas: u32) -> Self {
        let own_time = Self::time(own.0, own.1, 1.0, sq, ctas);
        let narrow_time = Self::time(narrow.0, narrow.1, narrow.2, sq, ctas);
        if narrow_time < own_time {
            narrow.0
        } else {
            own.0
        }
    }
}

/// A launch's query tile, the other one it may run (None where it runs one) and its grid's
/// order.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Plan {
    tile: QueryTile,
    other: Option<QueryTile>,
    order: Order,
}

/// The launch of `entry` on `q`: [`plan_tiles`]' choice among the manifest's `tiles` (its
/// narrower tile of the head dim), laid out as the module orders it ([`heads_first`]), or a
/// mixed launch of the entry's own tile (`tiles.mixed_d<D>`, [`mixed_tile`]) where the model
/// has it end sooner than the unmixed launch and than the narrower tile where that was chosen
/// ([`mixed_plan`]); the tile not run is then the other one.
fn plan_launch(
    consts: &KernelConstants,
    entry: crate::shapes::Entry,
    q: LaunchShape,
    kv_ctas: u32,
    tiles: &crate::kernels::Tiles,
    sms: u32,
    occupancy: impl Fn(QueryTile) -> Result<u32, DriverError>,
) -> Result<Plan, DriverError> {
    let narrow = tiles.narrow(entry.d).copied();
    let (tile, other) = plan_tiles(consts, entry, q, kv_ctas, narrow, sms, &occupancy)?;
    let planned = Plan {
        tile,
        other,
        order: Order::of(heads_first(entry, consts)),
    };
    let Some(short) = mixed_tile(consts, entry, kv_ctas, tiles.mixed(entry.d).copied()) else {
        return Ok(planned);
    };
    let own = QueryTile::own(consts, entry);
    let rival = match narrow {
        Some(n) if tile != own => {
            let ctas = (q.b * q.h) as u32 * kv_ctas;
            let slots = sms * occupancy(tile)?.max(1);
            tile.time(slots, n.cta_time, q.sq as u32, ctas)
        }
        _ => f64::INFINITY,
    };
    let own_slots = sms * occupancy(own)?.max(1);
    Ok(match mixed_plan(consts, q, own, short, own_slots, rival) {
        Some(t) => Plan {
            tile: own,
            other: if tile == own { other } else { Some(tile) },
            order: Order::Mixed(t),
        },
        None => planned,
    })
}

/// The query tile a launch of `entry` on `q` runs, and the other one it may run (None where it
/// runs one): the entry's own, or the manifest's narrower tile where the entry runs it (its
/// companion's function, or its own with fewer threads), the driver holds at least one of its
/// CTAs an SM (`occupancy` of a tile's CTA in the function that runs it: an error is the
/// launch's), and its CTAs end sooner ([`QueryTile::choose`]).
fn plan_tiles(
    consts: &KernelConstants,
    entry: crate::shapes::Entry,
    q: LaunchShape,
    kv_ctas: u32,
    narrow: Option<NarrowTile>,
    sms: u32,
    occupancy: impl Fn(QueryTile) -> Result<u32, DriverError>,
) -> Result<(QueryTile, Option<QueryTile>), DriverError> {
    let own = QueryTile::own(consts, entry);
    let Some((narrower, cta_time)) = narrow.and_then(|n| QueryTile::narrow(consts, entry, n))
    else {
        return Ok((own, None));
    };
    let narrow_fits = occupancy(narrower)?;
    if narrow_fits == 0 {
        return Ok((own, None));
    }
    let own_slots = sms * occupancy(own)?.max(1);
    let narrow_slots = sms * narrow_fits;
    let ctas = (q.b * q.h) as u32 * kv_ctas;
    // A causal launch's CTAs run unequal KV tiles: the list schedule of them, where it takes
    // the launch (docs/PERF.md "Stage D, change 37": the wave model picked the slower tile on
    // 1x16x4096x128 causal and 1x32x4096x128 GQA causal at D 128).
    let causal = (entry.causal && kv_ctas == 1).then(|| super::waves::Causal {
        heads: ctas,
        sq: q.sq as u32,
        sk: q.sk as u32,
        block_n: consts.block_n,
        heads_first: heads_first(entry, consts),
    });
    let ends = causal.and_then(|c| {
        Some((
            c.end(own.rows, 1.0, own_slots)?,
            c.end(narrower.rows, cta_time, narrow_slots)?,
        ))
    });
    let tile = match ends {
        Some((own_end, narrow_end)) if narrow_end < own_end => narrower,
        Some(_) => own,
        None => QueryTile::choose(
            (own, own_slots),
            (narrower, narrow_slots, cta_time),
            q.sq as u32,
            ctas,
        ),
    };
    Ok((tile, Some(if tile == own { narrower } else { own })))
}

/// Whether a module of `consts` launches `entry` with the heads on the grid's x: a causal entry
/// of a module that publishes `SDPA_CAUSAL_HEADS_FIRST` ([`launch_dims`]).
fn heads_first(entry: crate::shapes::Entry, consts: &KernelConstants) -> bool {
    entry.causal && consts.causal_heads_first
}

/// The most a grid's y counts (CUDA's limit; x counts up to 2^31 - 1).
const GRID_Y_MAX: usize = 65535;

/// Why a module of `consts` cannot launch `entry` on `q`, where it cannot: the grid's y counts
/// the heads (B·H), or with the heads first ([`heads_first`]) the query tiles, counted at the
/// narrowest tile the module may launch ([`narrowest_tile`]: the launch's own is chosen later,
/// at its first launch).
pub(super) fn grid_limit(
    entry: crate::shapes::Entry,
    q: LaunchShape,
    consts: &KernelConstants,
) -> Option<String> {
    if heads_first(entry, consts) {
        let rows = narrowest_tile(consts);
        let tiles = q.sq.div_ceil(rows);
        return (tiles > GRID_Y_MAX).then(|| {
            format!(
                "S_q = {} is {tiles} query tiles of {rows} rows (this kernel's narrowest), past \
                 the {GRID_Y_MAX} a causal launch of it puts on the grid's y; use S_q <= {}",
                q.sq,
                GRID_Y_MAX * rows
            )
        });
    }
    (q.b * q.h > GRID_Y_MAX).then(|| {
        format!(
            "B*H = {} exceeds the grid's limit of {GRID_Y_MAX} (b, h) pairs; use fewer batches \
             or heads",
            q.b * q.h
        )
    })
}

/// The fewest query rows a CTA of any entry of a module of `consts` may own: the entries' own
/// tiles, their narrowed ones and the companions'.
fn narrowest_tile(consts: &KernelConstants) -> usize {
    consts
        .query_tiles()
        .into_iter()
        .chain([consts.companion_rows, consts.companion_rows_d128].map(|r| r as usize))
        .filter(|&r| r > 0)
        .min()
        .unwrap_or(1)
}

/// How a launch's CTAs lie on its grid (the GPU starts them x first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// (query tiles, B·H, KV splits): a head's CTAs side by side.
    TilesFirst,
    /// (B·H, query tiles, KV splits): a causal launch of a module that publishes
    /// `SDPA_CAUSAL_HEADS_FIRST`, so every head's heaviest query tile starts before any lighter
    /// one ([`heads_first`]).
    HeadsFirst,
    /// (B·H, T, 1): a mixed launch of T query tiles a head, every head's full tiles first
    /// ([`mixed_plan`]).
    Mixed(u32),
}

impl Order {
    fn of(heads_first: bool) -> Self {
        if heads_first {
            Order::HeadsFirst
        } else {
            Order::TilesFirst
        }
    }
}

/// The grid and block of a launch of `tile` on `q`: a CTA per query tile, head and KV split
/// (`kv_ctas`), laid out in `order`.
fn launch_dims(
    tile: QueryTile,
    q: LaunchShape,
    kv_ctas: u32,
    order: Order,
) -> ((u32, u32, u32), (u32, u32, u32)) {
    let (tiles, heads) = ((q.sq as u32).div_ceil(tile.rows), (q.b * q.h) as u32);
    let grid = match order {
        Order::TilesFirst => (tiles, heads, kv_ctas),
        Order::HeadsFirst => (heads, tiles, kv_ctas),
        Order::Mixed(t) => (heads, t, 1),
    };
    (grid, (tile.threads, 1, 1))
}

/// The shorter tile a launch of the entry's own tile may mix in (the manifest's
/// `tiles.mixed_d<D>`), where it may: an unmasked, unsplit launch, of a module that publishes
/// `SDPA_MIXED_UNIT_ROWS`, whose entry narrows by that unit (`SDPA_NARROW_ROWS_D<D>`: the
/// kernel mixes only in entries that may leave a consumer without rows, those without turns of
/// their own), whose tile is whole units and the manifest's shorter one a unit short (a
/// manifest that names another mixes nothing: the kernel's rule is one unit).
fn mixed_tile(
    consts: &KernelConstants,
    entry: crate::shapes::Entry,
    kv_ctas: u32,
    mixed: Option<NarrowTile>,
) -> Option<NarrowTile> {
    let (unit, tile) = (consts.mixed_unit_rows, QueryTile::own(consts, entry));
    let short = mixed?;
    let whole = unit > 0
        && consts.narrow_step(entry) == unit
        && tile.rows.is_multiple_of(unit)
        && tile.rows / unit >= 2;
    (!entry.causal && kv_ctas == 1 && whole && short.rows + unit == tile.rows).then_some(short)
}

/// The query tiles a head of the mixed launch of `tile` (with `short`, its CTAs on `slots`
/// slots) that ends soonest, where the schedule model (src/backend/cuda/waves.rs) has it end
/// sooner by its margin than the unmixed launch and than `rival` (the narrower tile's end in
/// [`QueryTile::choose`]'s model, where the launch would take it); None where it does not.
fn mixed_plan(
    consts: &KernelConstants,
    q: LaunchShape,
    tile: QueryTile,
    short: NarrowTile,
    slots: u32,
    rival: f64,
) -> Option<u32> {
    let unit = consts.mixed_unit_rows;
    super::waves::Launch {
        units: (q.sq as u32).div_ceil(unit),
        n: tile.rows / unit,
        heads: u32::try_from(q.b * q.h).ok()?,
        slots,
        short: short.cta_time,
    }
    .plan(GRID_Y_MAX as u32, rival)
}

/// The query rows at or below which a launch may split (Stage C's `SDPA_SHORT_Q_ROWS`), and the
/// most bytes of parked states a split workspace holds: a split aims for at most 256 working
/// CTAs (`SDPA_SPLIT_KV_CTAS`, `_CTAS_8`), so packs × C <= 256, each pack at most 32 query
/// rows (a split query is short, run by 16-row warps: two row warps' rows) of 2C slots of D + 4
/// floats at D = 128: 256 × 32 × 2 × 132 × 4 bytes
/// (8.7 MB). For the memory check before a problem loads, and a bound for the default build's
/// constants only (a `--define` of a larger target, another KV split or wider packs may need
/// more); the workspace itself is sized exactly, and where its allocation fails the launch
/// stops with the driver's out-of-memory error (exit 4).
const SPLIT_MAX_ROWS: usize = 16;
const SPLIT_WORK_BOUND: u64 = 256 * 32 * 2 * 132 * 4;

/// Bytes of a split launch's workspace (cuda/sdpa_fp8_stage_c_mma.cu `split_kv_end`): one u32
/// arrival counter per query head, padded to 16 bytes, then per query row and slot (`slots`
/// = the module's KV split times the CTAs) D + 4 floats.
fn split_work_bytes(q: LaunchShape, d: usize, slots: u32) -> usize {
    let heads = q.b * q.h;
    heads.div_ceil(4) * 16 + heads * q.sq * slots as usize * (d + 4) * 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapes::Entry;

    fn tile(rows: u32, threads: u32) -> QueryTile {
        QueryTile { rows, threads }
    }

    /// A problem of `b` x `h` heads (H_kv = H), `sq` query rows and as many keys.
    fn q(b: usize, h: usize, sq: usize) -> LaunchShape {
        LaunchShape {
            b,
            h,
            hkv: h,
            sq,
            sk: sq,
        }
    }

    /// Stage D at D 64: its own 192 rows (512 threads, one CTA an SM) or 64 (256 threads, two
    /// an SM: the driver's occupancy of those launches), a narrow CTA 0.8 of a wide one's time.
    fn stage_d_d64(b: usize, h: usize, sq: usize) -> QueryTile {
        let (own, narrow) = (tile(192, 512), tile(64, 256));
        QueryTile::choose((own, 132), (narrow, 264, 0.8), sq as u32, (b * h) as u32)
    }

    #[test]
    fn the_narrower_tile_runs_where_its_waves_end_sooner() {
        // The fifteen D 64 problems measured with both tiles on an H100 (docs/PERF.md change
        // 23): each takes the tile that was faster there, but for 1x16x4096 causal (3% apart,
        // the model ignores the causal CTAs' unequal work).
        let narrow = [
            (1, 8, 512),   // mission: 24 wide CTAs, 7.1 us narrow where 11.2 wide
            (2, 8, 1000),  // 96 wide CTAs: 32.6 us / 40.2
            (1, 2, 77),    // 4.3 / 5.1
            (1, 4, 300),   // 6.1 / 9.8
            (1, 8, 2048),  // 23.3 / 28.4
            (2, 8, 2048),  // 176 wide CTAs, two waves of either: 43.5 / 52.3
            (1, 16, 1024), // 14.0 / 17.3
            (1, 32, 1024), // 25.3 / 30.8
            (16, 32, 1),   // decode: 512 CTAs of either, two waves narrow, four wide: 152 / 253
            (1, 32, 512),  // 41.8 / 49.6
        ];
        for (b, h, sq) in narrow {
            assert_eq!(stage_d_d64(b, h, sq).rows, 64, "{b}x{h}x{sq}");
        }
        let own = [
            (1, 12, 4096), // 264 wide CTAs, exactly two waves: 97.6 us wide where 118 narrow
            (1, 16, 4096), // 143 / 157
            (4, 16, 4096), // 514 / 603
            (1, 8, 16384), // 1063 / 1166
        ];
        for (b, h, sq) in own {
            assert_eq!(stage_d_d64(b, h, sq).rows, 192, "{b}x{h}x{sq}");
        }
    }

    #[test]
    fn the_plan_names_the_tile_not_chosen_and_drops_a_narrow_tile_no_sm_holds() {
        let c = KernelConstants {
            narrow_rows: 64,
            ..super::super::identity::per_head_dim_constants((192, 128), (512, 384))
        };
        let n = Some(NarrowTile {
            rows: 64,
            cta_time: 0.8,
        });
        let two_narrow_an_sm = |t: QueryTile| Ok(if t.threads == 256 { 2 } else { 1 });
        let (own, narrow) = (tile(192, 512), tile(64, 256));
        let d64 = Entry::BASE;
        // Mission: the narrow tile, the own one the other; 4x16x4096: the reverse.
        let plan = |q, occupancy: &dyn Fn(QueryTile) -> Result<u32, DriverError>| {
            plan_tiles(&c, d64, q, 1, n, 132, occupancy).unwrap()
        };
        assert_eq!(plan(q(1, 8, 512), &two_narrow_an_sm), (narrow, Some(own)));
        assert_eq!(plan(q(4, 16, 4096), &two_narrow_an_sm), (own, Some(narrow)));
        // No manifest tile, or an entry that does not narrow (D 128): the own tile alone.
        assert_eq!(
            plan_tiles(&c, d64, q(1, 8, 512), 1, None, 132, two_narrow_an_sm).unwrap(),
            (own, None)
        );
        let d128 = Entry {
            d: 128,
            ..Entry::BASE
        };
        let own128 = QueryTile::own(&c, d128);
        assert_eq!(
            plan_tiles(&c, d128, q(1, 8, 512), 1, n, 132, two_narrow_an_sm).unwrap(),
            (own128, None)
        );
        // A narrow CTA no SM can hold is never launched, not even as the other tile.
        assert_eq!(
            plan(q(1, 8, 512), &|t| Ok(u32::from(t.threads != 256))),
            (own, None)
        );
        // The driver's error is the launch's.
        let failing = |_| {
            Err(DriverError(
                cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            ))
        };
        assert!(plan_tiles(&c, d64, q(1, 8, 512), 1, n, 132, failing).is_err());
    }

    #[test]
    fn a_causal_launch_takes_the_tile_whose_heaviest_first_schedule_ends_sooner() {
        // Stage D at D 128: the 192-row entry or its 128-row companion at 0.76, one CTA an SM.
        let c = super::super::identity::stage_d_constants();
        let first = KernelConstants {
            causal_heads_first: true,
            ..c
        };
        let n = Some(NarrowTile {
            rows: 128,
            cta_time: 0.76,
        });
        let d128 = Entry {
            d: 128,
            causal: true,
        };
        let (own, companion) = (tile(192, 512), tile(128, 384));
        let one_an_sm = |_| Ok(1);
        let plan = |h, sq| {
            plan_tiles(&first, d128, q(1, h, sq), 1, n, 132, one_an_sm)
                .unwrap()
                .0
        };
        // Both have 3 and 4 waves (3.0 against 3.04 in the wave model, which took the entry);
        // heaviest first, 16 heads end sooner on the companion's 128 rows, 32 on 192.
        assert_eq!(plan(16, 4096), companion);
        assert_eq!(plan(32, 4096), own);
        // Unmasked, the wave model: 3 waves of the entry against 4 x 0.76 of the companion.
        let unmasked = Entry {
            causal: false,
            ..d128
        };
        assert_eq!(
            plan_tiles(&first, unmasked, q(1, 16, 4096), 1, n, 132, one_an_sm)
                .unwrap()
                .0,
            own
        );
    }

    #[test]
    fn a_tie_keeps_the_entrys_own_tile() {
        let (own, narrow) = (tile(128, 384), tile(64, 256));
        // One wave each; a narrow CTA as slow as a wide one.
        assert_eq!(
            QueryTile::choose((own, 132), (narrow, 132, 1.0), 128, 16),
            own
        );
        assert_eq!(
            QueryTile::choose((own, 132), (narrow, 132, 0.99), 128, 16),
            narrow
        );
    }

    #[test]
    fn each_head_dim_launches_its_own_query_tiles_and_threads() {
        let c = super::super::identity::per_head_dim_constants((192, 128), (512, 384));
        let q = gqa_2x16x4096();
        let d64 = Entry {
            d: 64,
            causal: true,
        };
        let d128 = Entry {
            d: 128,
            causal: true,
        };
        // 4096 rows: 22 tiles of 192 (the last partial), 32 of 128.
        let own = |e| QueryTile::own(&c, e);
        assert_eq!(
            launch_dims(own(d64), q, 1, Order::TilesFirst),
            ((22, 32, 1), (512, 1, 1))
        );
        assert_eq!(
            launch_dims(own(d128), q, 3, Order::TilesFirst),
            ((32, 32, 3), (384, 1, 1))
        );
        // A narrower tile of a module that narrows: 64 rows with one warpgroup, 256 threads.
        let narrows = KernelConstants {
            narrow_rows: 64,
            ..c
        };
        let n = NarrowTile {
            rows: 64,
            cta_time: 0.8,
        };
        let (tile, _) = QueryTile::narrow(&narrows, d64, n).unwrap();
        assert_eq!(
            launch_dims(tile, q, 1, Order::TilesFirst),
            ((64, 32, 1), (256, 1, 1))
        );
        assert_eq!(
            QueryTile::narrow(&c, d64, n),
            None,
            "no narrowing published"
        );
        assert_eq!(
            QueryTile::narrow(&narrows, d128, n),
            None,
            "this module's D 128 entry publishes no narrowing"
        );
    }

    /// 2x16x4096 with 4 K/V heads: 22 query tiles of 192 rows, 32 of 128.
    fn gqa_2x16x4096() -> LaunchShape {
        LaunchShape {
            b: 2,
            h: 16,
            hkv: 4,
            sq: 4096,
            sk: 4096,
        }
    }

    /// Stage D's module as far as its query tiles go, without and with
    /// `SDPA_CAUSAL_HEADS_FIRST`.
    fn heads_first_pair() -> (KernelConstants, KernelConstants) {
        let plain = super::super::identity::stage_d_constants();
        let first = KernelConstants {
            causal_heads_first: true,
            ..plain
        };
        (plain, first)
    }

    #[test]
    fn a_causal_launch_of_a_heads_first_module_counts_heads_on_x_and_query_tiles_on_y() {
        let (plain, first) = heads_first_pair();
        let (causal, unmasked) = (
            Entry {
                d: 64,
                causal: true,
            },
            Entry::BASE,
        );
        // Only a causal entry of a module that publishes it.
        assert!(heads_first(causal, &first));
        assert!(!heads_first(unmasked, &first));
        assert!(!heads_first(causal, &plain));
        let q = gqa_2x16x4096();
        let tile = QueryTile::own(&first, causal);
        assert_eq!(
            launch_dims(tile, q, 1, Order::HeadsFirst),
            ((32, 22, 1), (512, 1, 1))
        );
        assert_eq!(
            launch_dims(tile, q, 1, Order::TilesFirst),
            ((22, 32, 1), (512, 1, 1))
        );
    }

    #[test]
    fn a_mixed_launch_needs_an_unmasked_unsplit_own_tile_of_whole_units_and_a_module_that_mixes() {
        let plain = KernelConstants {
            narrow_rows: 64,
            ..super::super::identity::stage_d_constants()
        };
        let mixes = KernelConstants {
            mixed_unit_rows: 64,
            ..plain
        };
        // An entry with turns of its own publishes no narrowing (a build of PINGPONG_D64=3):
        // its kernel never mixes, so neither does the host.
        let turns = KernelConstants {
            narrow_rows: 0,
            ..mixes
        };
        let d64 = Entry::BASE;
        let own = QueryTile::own(&mixes, d64);
        let short = NarrowTile {
            rows: 128,
            cta_time: 0.89,
        };
        assert_eq!(mixed_tile(&mixes, d64, 1, Some(short)), Some(short));
        let causal = Entry {
            causal: true,
            ..d64
        };
        let two_short = NarrowTile { rows: 64, ..short };
        for (why, got) in [
            ("causal", mixed_tile(&mixes, causal, 1, Some(short))),
            ("split KV", mixed_tile(&mixes, d64, 2, Some(short))),
            ("no manifest tile", mixed_tile(&mixes, d64, 1, None)),
            (
                "a module that never mixes",
                mixed_tile(&plain, d64, 1, Some(short)),
            ),
            (
                "two units short",
                mixed_tile(&mixes, d64, 1, Some(two_short)),
            ),
            (
                "an entry with turns",
                mixed_tile(&turns, d64, 1, Some(short)),
            ),
        ] {
            assert_eq!(got, None, "{why}");
        }
        // 1x16x4096x64: 24 tiles a head on (B*H, 24), where 22 would end a third wave of full
        // CTAs on 88 of 132 SMs.
        let q = q(1, 16, 4096);
        assert_eq!(
            mixed_plan(&mixes, q, own, short, 132, f64::INFINITY),
            Some(24)
        );
        // A narrower tile whose waves end at 2.84 of a full CTA (4 of 0.71) keeps its launch, one
        // at 3.04 (4 of 0.76, the companion's time since stop 57) does not.
        assert_eq!(mixed_plan(&mixes, q, own, short, 132, 2.84), None);
        assert_eq!(mixed_plan(&mixes, q, own, short, 132, 3.04), Some(24));
        assert_eq!(
            launch_dims(own, q, 1, Order::Mixed(24)),
            ((16, 24, 1), (512, 1, 1))
        );
    }

    #[test]
    fn a_mixed_launch_replaces_the_chosen_tile_only_where_it_ends_sooner_than_it() {
        // Stage D at D 128 (192-row entry, 128-row companion, one CTA an SM) on 1x16x4096: 3
        // waves of the entry, 4 of the companion, the entry mixed ends at 2 + the short time.
        let c = KernelConstants {
            narrow_rows_d128: 64,
            mixed_unit_rows: 64,
            causal_heads_first: true,
            ..super::super::identity::stage_d_constants()
        };
        let manifest = |narrow: f64, mixed: f64| crate::kernels::Tiles {
            block_m: Some(192),
            block_m_d128: Some(192),
            block_n: 128,
            kv_split: 1,
            narrow_d64: None,
            narrow_d128: Some(NarrowTile {
                rows: 128,
                cta_time: narrow,
            }),
            mixed_d64: None,
            mixed_d128: Some(NarrowTile {
                rows: 128,
                cta_time: mixed,
            }),
        };
        let d128 = Entry {
            d: 128,
            causal: false,
        };
        let (own, companion) = (tile(192, 512), tile(128, 384));
        let plan = |entry, narrow, mixed| {
            plan_launch(
                &c,
                entry,
                q(1, 16, 4096),
                1,
                &manifest(narrow, mixed),
                132,
                |_| Ok(1),
            )
            .unwrap()
        };
        let mixed = |other| Plan {
            tile: own,
            other: Some(other),
            order: Order::Mixed(24),
        };
        // The entry chosen (3.0 against 3.04), mixed (2.89): the companion stays the other.
        assert_eq!(plan(d128, 0.76, 0.89), mixed(companion));
        // The companion chosen at 2.84, below the mixed 2.89: unmixed, as chosen.
        let unmixed = Plan {
            tile: companion,
            other: Some(own),
            order: Order::TilesFirst,
        };
        assert_eq!(plan(d128, 0.71, 0.89), unmixed);
        // The companion chosen at 2.94, the mixed entry 2.85 (3% sooner): the entry runs mixed
        // and the companion is the other.
        assert_eq!(plan(d128, 0.735, 0.85), mixed(companion));
        // Causal: never mixed, laid out heads first.
        let causal = Entry {
            causal: true,
            ..d128
        };
        assert_eq!(plan(causal, 0.76, 0.89).order, Order::HeadsFirst);
    }

    #[test]
    fn a_grid_past_its_y_limit_is_refused_with_what_to_shrink() {
        let (plain, first) = heads_first_pair();
        let causal = Entry {
            d: 128,
            causal: true,
        };
        let q = |b, h, sq| LaunchShape {
            b,
            h,
            hkv: 1,
            sq,
            sk: 1,
        };
        // The heads on y: B*H past 65535 is refused, S_q is not limited.
        let why = grid_limit(causal, q(2, 32768, 64), &plain).unwrap();
        assert!(
            why.contains("B*H = 65536") && why.contains("fewer batches"),
            "{why}"
        );
        assert_eq!(grid_limit(causal, q(1, 65535, 1 << 23), &plain), None);
        // The heads first: B*H on x is not limited; S_q is, at the narrowest tile (Stage D's
        // D 128 companion is 128 rows, its entries 192: 192).
        assert_eq!(grid_limit(causal, q(2, 32768, 64), &first), None);
        assert_eq!(grid_limit(causal, q(1, 1, 65535 * 128), &first), None);
        let why = grid_limit(causal, q(1, 1, 65535 * 128 + 1), &first).unwrap();
        assert!(
            why.contains("65536 query tiles of 128 rows") && why.contains("S_q <= 8388480"),
            "{why}"
        );
        // A module whose entries narrow to 64 rows (Stage D's D 64) or own 32 (Stage C's):
        // the narrowest counts.
        let narrows = KernelConstants {
            narrow_rows: 64,
            ..first
        };
        assert!(grid_limit(causal, q(1, 1, 65535 * 64 + 1), &narrows).is_some());
        assert_eq!(grid_limit(causal, q(1, 1, 65535 * 64), &narrows), None);
        let stage_c = KernelConstants {
            causal_heads_first: true,
            ..super::super::identity::per_head_dim_constants((32, 64), (128, 128))
        };
        assert_eq!(narrowest_tile(&stage_c), 32);
        assert!(grid_limit(causal, q(1, 1, 65535 * 32 + 1), &stage_c).is_some());
        // An unmasked entry of the same module keeps the heads on y.
        assert!(grid_limit(Entry::BASE, q(2, 32768, 64), &first).is_some());
    }

    #[test]
    fn a_companion_runs_its_entrys_narrower_tile_with_its_own_threads() {
        // Stage D's D 128: the entry's 192 rows (512 threads) and its companion's 128 (384),
        // a function of its own; here the entry itself does not narrow.
        let c = super::super::identity::stage_d_constants();
        let d128 = Entry {
            d: 128,
            causal: false,
        };
        let n = Some(NarrowTile {
            rows: 128,
            cta_time: 0.7,
        });
        let asked = std::cell::RefCell::new(Vec::new());
        let one_an_sm = |t: QueryTile| {
            asked.borrow_mut().push(t);
            Ok(1)
        };
        let (own, companion) = (tile(192, 512), tile(128, 384));
        assert_eq!(c.narrow_step(d128), 0);
        // 1x16x4096: 22 x 16 = 352 wide CTAs (3 waves of 132) against 512 narrow ones (4 waves
        // of 0.7): the companion. 4x16x8192: 43 x 64 = 2752 (21 waves) against 4096 (32 x 0.7 =
        // 22.4): the entry's own.
        let plan = |q| plan_tiles(&c, d128, q, 1, n, 132, one_an_sm).unwrap();
        assert_eq!(plan(q(1, 16, 4096)), (companion, Some(own)));
        assert_eq!(plan(q(4, 16, 8192)), (own, Some(companion)));
        assert!(
            asked.borrow().iter().all(|t| *t == own || *t == companion),
            "the driver is asked of the two tiles only: {:?}",
            asked.borrow()
        );
        // Without the companion an entry that does not narrow runs its own tile alone.
        let alone = KernelConstants {
            companion_rows_d128: 0,
            companion_threads_d128: 0,
            ..c
        };
        assert_eq!(
            plan_tiles(&alone, d128, q(1, 16, 4096), 1, n, 132, |_| Ok(1)).unwrap(),
            (own, None)
        );
    }
}
