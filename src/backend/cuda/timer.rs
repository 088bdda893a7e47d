//! GPU timing with CUDA events: each sample is `batch` launches between two events; with
//! `--l2 flush` a buffer twice the L2 size is overwritten before each sample, outside the
//! events. Events are created once and reused.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DriverError};

use super::identity::KernelConstants;
use super::launch::DeviceProblem;
use crate::timing::{L2Mode, TimingPlan};

#[derive(Default)]
pub struct Timer {
    events: Vec<(CudaEvent, CudaEvent)>,
    flush: Option<CudaSlice<u8>>,
}

impl Timer {
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
