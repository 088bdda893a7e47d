//! GPU timing with CUDA events: each sample is `batch` launches between two events; with
//! `--l2 flush` a buffer twice the L2 size is overwritten before each sample, outside the
//! events. Events are created once and reused. Each block of samples sits behind a hold
//! kernel that the host releases once the whole block is enqueued, so samples run back to
//! back; a hold that expired (the host stalled) is detected and its block measured again.
//! Stamps of SM 0's cycle counter and the global timer around the block give the mean SM
//! clock it ran at, so blocks measured while the clock sagged can be told apart
//! (cuda/timer_hold.cu; docs/DESIGN.md "Timing and comparison").

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DriverError, LaunchConfig,
    PinnedHostSlice, PushKernelArg, sys,
};
use cudarc::nvrtc::Ptx;

use super::LoadedVariant;
use super::launch::DeviceProblem;
use super::nvrtc;
use crate::backend::BackendError;
use crate::timing::{L2Mode, TimedBlock, TimingPlan};

/// The hold and stamp kernels, compiled into the binary (they are part of the runner, not
/// of the kernel under test); cuda/timer_hold.cu describes the mailbox they share.
const HOLD_SOURCE: &str = include_str!("../../../cuda/timer_hold.cu");

/// Mailbox words (cuda/timer_hold.cu).
const RELEASE: usize = 0;
const STATUS: usize = 1;
const START: usize = 2;
const STOP: usize = 4;
const MAILBOX_WORDS: usize = 8;

/// How long a hold waits for the host before it gives up: far longer than enqueuing a block
/// takes, unless the host stalls.
const HOLD_TIMEOUT_BASE_US: i64 = 20_000;
const HOLD_TIMEOUT_PER_LAUNCH_US: i64 = 200;

/// Attempts per block while its hold keeps expiring.
const ATTEMPTS: u32 = 3;

/// Most launches enqueued behind one hold: past the driver's queue depth `cuLaunchKernel`
/// blocks while the hold waits for the host, and the hold could only expire (nvbench warns
/// the same). Longer blocks (large `--batch`) run without a hold; their samples are long
/// enough for the host to keep ahead.
const MAX_HELD_LAUNCHES: usize = 256;

/// Page-locked host words mapped into the device's address space.
struct Mailbox {
    host: *mut u64,
    device: u64,
    _memory: PinnedHostSlice<u64>,
}

// SAFETY: `host` points into `_memory`, which the mailbox owns and which moves with it; the
// words are read and written through `&self` by the one thread that holds the backend (the
// mailbox is not `Sync`).
unsafe impl Send for Mailbox {}

impl Mailbox {
    fn new(ctx: &Arc<CudaContext>) -> Result<Self, DriverError> {
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: the words are written below before any kernel reads them.
        let mut memory = unsafe { ctx.alloc_pinned_with_flags::<u64>(MAILBOX_WORDS, flags) }?;
        let host = memory.as_mut_ptr()?;
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` is a live allocation made with DEVICEMAP.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) }.result()?;
        let mailbox = Mailbox {
            host,
            device,
            _memory: memory,
        };
        for word in 0..MAILBOX_WORDS {
            mailbox.write(word, 0);
        }
        Ok(mailbox)
    }

    fn write(&self, word: usize, value: u64) {
        assert!(word < MAILBOX_WORDS);
        // SAFETY: in bounds; the device reads the word with volatile loads.
        unsafe { std::ptr::write_volatile(self.host.add(word), value) };
        fence(Ordering::SeqCst);
    }

    fn read(&self, word: usize) -> u64 {
        assert!(word < MAILBOX_WORDS);
        fence(Ordering::SeqCst);
        // SAFETY: in bounds; read after the stream synchronized.
        unsafe { std::ptr::read_volatile(self.host.add(word)) }
    }
}

pub struct Timer {
    events: Vec<(CudaEvent, CudaEvent)>,
    flush: Option<CudaSlice<u8>>,
    hold: CudaFunction,
    stamp: CudaFunction,
    mailbox: Mailbox,
    /// The number of the last block enqueued (the hold waits for it in RELEASE).
    block: u64,
    sm_count: u32,
    cycles_per_us: i64,
}

/// Compiles the hold and stamp kernels (cuda/timer_hold.cu) for `arch`; run beside the
/// variants' builds.
pub fn compile(include: &Path, arch: &str) -> Result<nvrtc::Compiled, BackendError> {
    let options = nvrtc::build_options(arch, &[include], &[]);
    nvrtc::compile(HOLD_SOURCE, "timer_hold.cu", &options).map_err(|e| {
        BackendError::Kernel(format!("the timer's hold kernel failed to compile: {e}"))
    })
}

impl Timer {
    /// Loads the hold and stamp kernels [`compile`] built.
    pub fn load(
        ctx: &Arc<CudaContext>,
        compiled: nvrtc::Compiled,
        sm_clock_mhz: u32,
        sm_count: u32,
    ) -> Result<Self, BackendError> {
        let failed = |e: DriverError| {
            BackendError::Kernel(format!("loading the timer's kernels failed: {e}"))
        };
        let module = ctx
            .load_module(Ptx::from_binary(compiled.cubin))
            .map_err(failed)?;
        let hold = module.load_function("sdpa_timer_hold").map_err(failed)?;
        let stamp = module.load_function("sdpa_timer_stamp").map_err(failed)?;
        let mailbox = Mailbox::new(ctx).map_err(|e| {
            BackendError::Environment(format!(
                "the timer's mapped host memory could not be allocated: {e}"
            ))
        })?;
        Ok(Timer {
            events: Vec::new(),
            flush: None,
            hold,
            stamp,
            mailbox,
            block: 0,
            sm_count: sm_count.max(1),
            cycles_per_us: sm_clock_mhz.max(1) as i64,
        })
    }

    /// Times a block of `count` samples of `function` on `problem`, in microseconds per
    /// launch, with the mean SM clock over it; a block whose hold expired is measured again,
    /// up to [`ATTEMPTS`] times.
    #[allow(clippy::too_many_arguments)]
    pub fn time(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        variant: &LoadedVariant,
        problem: &mut DeviceProblem,
        count: usize,
        plan: &TimingPlan,
        l2_bytes: usize,
    ) -> Result<TimedBlock, DriverError> {
        while self.events.len() < count {
            self.events.push((
                ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
                ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
            ));
        }
        if plan.l2 == L2Mode::Flush && self.flush.is_none() {
            self.flush = Some(stream.alloc_zeros::<u8>((2 * l2_bytes).max(8 << 20))?);
        }
        let mut retries = 0;
        loop {
            let (samples, sm_mhz, expired) = self.attempt(stream, variant, problem, count, plan)?;
            if !expired || retries + 1 == ATTEMPTS {
                return Ok(TimedBlock {
                    samples,
                    sm_mhz,
                    retries,
                    hold_expired: expired,
                });
            }
            retries += 1;
        }
    }

    /// One attempt: hold, start stamp, the samples, stop stamp; then the host releases the
    /// hold and waits. Returns the samples, the SM clock and whether the hold expired.
    fn attempt(
        &mut self,
        stream: &Arc<CudaStream>,
        variant: &LoadedVariant,
        problem: &mut DeviceProblem,
        count: usize,
        plan: &TimingPlan,
    ) -> Result<(Vec<f64>, Option<f64>, bool), DriverError> {
        self.block += 1;
        let block = self.block;
        for word in STATUS..MAILBOX_WORDS {
            self.mailbox.write(word, 0);
        }
        let launches = (count * plan.batch) as i64;
        let timeout =
            (HOLD_TIMEOUT_BASE_US + HOLD_TIMEOUT_PER_LAUNCH_US * launches) * self.cycles_per_us;
        let one = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (1, 1, 1),
            shared_mem_bytes: 0,
        };
        let per_sm = LaunchConfig {
            grid_dim: (self.sm_count, 1, 1),
            ..one
        };
        let mailbox = self.mailbox.device;
        let (start_slot, stop_slot) = (START as i32, STOP as i32);
        let held = count * plan.batch <= MAX_HELD_LAUNCHES;
        if held {
            unsafe {
                stream
                    .launch_builder(&self.hold)
                    .arg(&mailbox)
                    .arg(&block)
                    .arg(&timeout)
                    .launch(one)?;
            }
        }
        // From here on the hold spins: whatever fails, it is released below.
        let enqueued = (|| -> Result<(), DriverError> {
            unsafe {
                stream
                    .launch_builder(&self.stamp)
                    .arg(&mailbox)
                    .arg(&start_slot)
                    .launch(per_sm)?;
            }
            for (start, end) in &self.events[..count] {
                if let (L2Mode::Flush, Some(buf)) = (plan.l2, self.flush.as_mut()) {
                    stream.memset_zeros(buf)?;
                }
                start.record(stream)?;
                for _ in 0..plan.batch {
                    problem.launch(stream, variant, 0)?;
                }
                end.record(stream)?;
            }
            unsafe {
                stream
                    .launch_builder(&self.stamp)
                    .arg(&mailbox)
                    .arg(&stop_slot)
                    .launch(per_sm)
            }
            .map(|_| ())
        })();
        // Released whatever happened, so that a failed enqueue cannot leave the GPU spinning.
        self.mailbox.write(RELEASE, block);
        enqueued?;
        stream.synchronize()?;
        let samples = self.events[..count]
            .iter()
            .map(|(start, end)| Ok(start.elapsed_ms(end)? as f64 * 1e3 / plan.batch as f64))
            .collect::<Result<Vec<f64>, DriverError>>()?;
        let status = self.mailbox.read(STATUS);
        let expired = held && status != block << 1;
        let sm_mhz = sm_clock_mhz(
            [self.mailbox.read(START), self.mailbox.read(START + 1)],
            [self.mailbox.read(STOP), self.mailbox.read(STOP + 1)],
        );
        Ok((samples, sm_mhz, expired))
    }
}

/// The mean SM clock between two stamps of (%globaltimer ns, clock64 cycles) on SM 0, in MHz;
/// None when a stamp is missing (no block ran on SM 0) or the interval is empty.
fn sm_clock_mhz(start: [u64; 2], stop: [u64; 2]) -> Option<f64> {
    let ns = stop[0].checked_sub(start[0])?;
    let cycles = stop[1].checked_sub(start[1])?;
    (start[0] != 0 && stop[0] != 0 && ns > 0).then(|| cycles as f64 / ns as f64 * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sm_clock_is_cycles_over_nanoseconds_between_two_stamps() {
        // 198_000 cycles in 100 µs: 1980 MHz.
        let mhz = sm_clock_mhz([5_000_000, 1_000], [5_100_000, 199_000]).unwrap();
        assert!((mhz - 1980.0).abs() < 1e-9, "{mhz}");
    }

    #[test]
    fn a_missing_or_backward_stamp_gives_no_clock() {
        assert_eq!(
            sm_clock_mhz([0, 0], [5_100_000, 199_000]),
            None,
            "no start stamp"
        );
        assert_eq!(
            sm_clock_mhz([5_000_000, 1_000], [0, 0]),
            None,
            "no stop stamp"
        );
        assert_eq!(
            sm_clock_mhz([5_000_000, 1_000], [5_000_000, 9_000]),
            None,
            "no time"
        );
        assert_eq!(
            sm_clock_mhz([5_000_000, 9_000], [5_100_000, 1_000]),
            None,
            "backward"
        );
    }
}
