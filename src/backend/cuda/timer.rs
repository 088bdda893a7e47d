//! GPU timing with CUDA events: each sample is `batch` launches between two events; with
//! `--l2 flush` a buffer twice the L2 size is overwritten before each sample, outside the
//! events. Events are created once and reused. Before each block of samples a one-thread
//! kernel (cuda/timer_hold.cu) holds the GPU while the block is enqueued, so samples run back
//! to back and a short kernel's time does not include the host's launch latency.

use std::path::Path;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use super::identity::KernelConstants;
use super::launch::DeviceProblem;
use super::nvrtc;
use crate::backend::BackendError;
use crate::timing::{L2Mode, TimingPlan};

/// The hold kernel, compiled into the binary (it is part of the runner, not of the kernel
/// under test).
const HOLD_SOURCE: &str = include_str!("../../../cuda/timer_hold.cu");

/// Hold time per block: enough for the host to enqueue every sample of it.
const HOLD_BASE_US: i64 = 200;
const HOLD_PER_SAMPLE_US: i64 = 20;

pub struct Timer {
    events: Vec<(CudaEvent, CudaEvent)>,
    flush: Option<CudaSlice<u8>>,
    hold: CudaFunction,
    cycles_per_us: i64,
}

impl Timer {
    pub fn new(
        ctx: &Arc<CudaContext>,
        include: &Path,
        arch: &str,
        sm_clock_mhz: u32,
    ) -> Result<Self, BackendError> {
        let options = nvrtc::build_options(arch, &[include], &[]);
        let compiled = nvrtc::compile(HOLD_SOURCE, "timer_hold.cu", &options).map_err(|e| {
            BackendError::Kernel(format!("the timer's hold kernel failed to compile: {e}"))
        })?;
        let hold = ctx
            .load_module(Ptx::from_binary(compiled.cubin))
            .and_then(|m| m.load_function("sdpa_timer_hold"))
            .map_err(|e| {
                BackendError::Kernel(format!("loading the timer's hold kernel failed: {e}"))
            })?;
        Ok(Timer {
            events: Vec::new(),
            flush: None,
            hold,
            cycles_per_us: sm_clock_mhz.max(1) as i64,
        })
    }

    /// Times `count` samples of `function` on `problem`, in microseconds per launch.
    #[allow(clippy::too_many_arguments)]
    pub fn time(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        function: &CudaFunction,
        consts: &KernelConstants,
        problem: &mut DeviceProblem,
        count: usize,
        plan: &TimingPlan,
        l2_bytes: usize,
    ) -> Result<Vec<f64>, DriverError> {
        while self.events.len() < count {
            self.events.push((
                ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
                ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
            ));
        }
        if plan.l2 == L2Mode::Flush && self.flush.is_none() {
            self.flush = Some(stream.alloc_zeros::<u8>((2 * l2_bytes).max(8 << 20))?);
        }
        let cycles =
            (HOLD_BASE_US + HOLD_PER_SAMPLE_US * (count * plan.batch) as i64) * self.cycles_per_us;
        let hold = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        unsafe { stream.launch_builder(&self.hold).arg(&cycles).launch(hold) }?;
        for (start, end) in &self.events[..count] {
            if let (L2Mode::Flush, Some(buf)) = (plan.l2, self.flush.as_mut()) {
                stream.memset_zeros(buf)?;
            }
            start.record(stream)?;
            for _ in 0..plan.batch {
                problem.launch(stream, function, consts, 0)?;
            }
            end.record(stream)?;
        }
        stream.synchronize()?;
        self.events[..count]
            .iter()
            .map(|(start, end)| Ok(start.elapsed_ms(end)? as f64 * 1e3 / plan.batch as f64))
            .collect()
    }
}
