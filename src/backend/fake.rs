//! A test backend: the CPU backend with a pretend device, for the tests of what the runner and
//! the commands do with a GPU's extras (device yardsticks, their faults and memory limits,
//! query tiles, a second launch geometry, the launch it times) without a GPU.

use half::f16;

use super::cpu::CpuBackend;
use super::{Backend, BackendError, OnDevice};
use crate::emulation::{self, Algorithm, Defect};
use crate::problem::Problem;
use crate::rows::RowSet;
use crate::schema::GpuSlot;
use crate::timing::{self, TimingPlan};

/// A backend with a device whose reference sums and emulation are the host's, or
/// unavailable (as when the GPU runs out of memory for them); it counts the requests.
pub(crate) struct FakeDevice {
    pub(crate) cpu: CpuBackend,
    pub(crate) out_of_memory: bool,
    pub(crate) requests: usize,
    pub(crate) emulation_requests: usize,
    /// Its reference kernel faults (the runner's own kernel: exit 3).
    pub(crate) reference_faults: bool,
    pub(crate) gpu: Option<GpuSlot>,
    /// The query tiles each variant says it launches (none: the CPU backend's).
    pub(crate) tiles: Vec<Vec<usize>>,
    /// Its entry runs another launch geometry, whose output has these elements' bits
    /// flipped (empty: the same output; None: no other geometry).
    pub(crate) other_geometry_flips: Option<Vec<usize>>,
    /// The launch it says it times.
    pub(crate) timed_launch: Option<crate::schema::LaunchRecord>,
    /// Each warm-up launch also takes this long (a problem of long launches).
    pub(crate) warm_up_launch: std::time::Duration,
}

impl FakeDevice {
    pub(crate) fn new(out_of_memory: bool) -> Self {
        FakeDevice {
            cpu: CpuBackend::new(Defect::None),
            out_of_memory,
            requests: 0,
            emulation_requests: 0,
            reference_faults: false,
            gpu: None,
            tiles: Vec::new(),
            other_geometry_flips: None,
            timed_launch: None,
            warm_up_launch: std::time::Duration::ZERO,
        }
    }

    /// A worker that says it is GPU `index`.
    pub(crate) fn gpu(index: usize) -> Self {
        FakeDevice {
            gpu: Some(GpuSlot {
                index,
                uuid: format!("GPU-fake-{index}"),
            }),
            ..Self::new(false)
        }
    }
}

impl Backend for FakeDevice {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn variants(&self) -> &[String] {
        self.cpu.variants()
    }
    fn query_tiles_of(&self, v: usize) -> Vec<usize> {
        match self.tiles.get(v) {
            Some(t) => t.clone(),
            None => self.cpu.query_tiles_of(v),
        }
    }
    fn load(&mut self, p: &Problem) -> Result<(), BackendError> {
        self.cpu.load(p)
    }
    fn launch_poisoned(&mut self, v: usize) -> Result<Vec<f16>, BackendError> {
        self.cpu.launch_poisoned(v)
    }
    fn timed_launch(&mut self, _: usize) -> Option<crate::schema::LaunchRecord> {
        self.timed_launch.clone()
    }
    fn other_geometries(&mut self, v: usize) -> Result<Vec<Vec<f16>>, BackendError> {
        let Some(flips) = self.other_geometry_flips.clone() else {
            return Ok(Vec::new());
        };
        let mut out = self.cpu.launch_poisoned(v)?;
        for i in flips {
            out[i] = f16::from_bits(out[i].to_bits() ^ 1);
        }
        Ok(vec![out])
    }
    fn warm_up(&mut self, v: usize, launches: usize) -> Result<(), BackendError> {
        std::thread::sleep(self.warm_up_launch * launches as u32);
        self.cpu.warm_up(v, launches)
    }
    fn time_samples(
        &mut self,
        v: usize,
        count: usize,
        plan: &TimingPlan,
    ) -> Result<timing::TimedBlock, BackendError> {
        self.cpu.time_samples(v, count, plan)
    }
    fn clock(&self) -> &'static str {
        self.cpu.clock()
    }
    fn device_name(&self) -> String {
        self.cpu.device_name()
    }
    fn device_json(&self) -> serde_json::Value {
        self.cpu.device_json()
    }
    fn details(&self) -> serde_json::Value {
        self.cpu.details()
    }
    fn describe(&self) -> String {
        self.cpu.describe()
    }
    fn has_device(&self) -> bool {
        true
    }
    fn gpu(&self) -> Option<GpuSlot> {
        self.gpu.clone()
    }
    fn reference_sums(
        &mut self,
        p: &Problem,
        reading: crate::reference::Reading,
        rows: &RowSet,
    ) -> Result<crate::backend::DeviceSums, BackendError> {
        self.requests += 1;
        if self.reference_faults {
            return Err(BackendError::Environment(
                "the reference kernel faulted".into(),
            ));
        }
        Ok(if self.out_of_memory {
            OnDevice::Unavailable("the reference ran out of GPU memory".into())
        } else {
            OnDevice::Computed(crate::reference::RowSums::read(p, rows, reading))
        })
    }
    fn emulation_on_device(
        &mut self,
        p: &Problem,
        alg: Algorithm,
        rows: &RowSet,
    ) -> Result<OnDevice<Vec<f16>>, BackendError> {
        self.emulation_requests += 1;
        Ok(if self.out_of_memory {
            OnDevice::Unavailable("the emulation ran out of GPU memory".into())
        } else {
            OnDevice::Computed(emulation::clean(p, alg, rows))
        })
    }
}
