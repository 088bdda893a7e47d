//! sdpa-runner: tells a kernel engineer whether a change to the Stage-C FP8 attention kernel
//! is still correct and really faster, and lets CI refuse it when it is not.
//!
//! One spine (docs/DESIGN.md "The spine"): [`commands`] prepare (every input checked first),
//! [`runner`] measures (shape + seed -> `inputs` -> [`fp8`] quantization ([`problem`]) -> a
//! [`backend`] run -> `metrics` against the `reference`s and the `emulation` -> `verdict`s),
//! `analysis` decides every gate once, `publish` writes the files atomically, and `console`
//! prints. `error` turns the outcome into the exit code. No two top-level modules depend on
//! each other, directly or through others (tests/architecture.rs).

pub(crate) mod analysis;
pub mod backend;
pub mod cli;
pub(crate) mod clocks;
pub mod commands;
pub(crate) mod console;
pub mod devices;
pub mod emulation;
pub(crate) mod error;
pub(crate) mod exchange;
pub(crate) mod floors;
pub mod fp8;
pub mod gates;
pub(crate) mod grade;
pub(crate) mod inputs;
pub mod interrupt;
pub(crate) mod json;
pub mod kernels;
pub(crate) mod merge;
pub(crate) mod metrics;
pub(crate) mod mutants;
pub mod paths;
pub(crate) mod perf;
pub mod problem;
pub(crate) mod progress;
pub(crate) mod publish;
pub(crate) mod quantizer;
pub mod reference;
pub(crate) mod render;
pub(crate) mod repeat;
pub(crate) mod report;
pub mod rows;
pub mod runner;
pub(crate) mod sanitize;
pub(crate) mod scale_fit;
pub(crate) mod schema;
pub(crate) mod sensitivity;
pub mod shapes;
pub(crate) mod shard;
pub(crate) mod stats;
#[doc(hidden)]
pub mod testing;
pub(crate) mod timing;
pub mod trace;
pub(crate) mod usage;
pub(crate) mod verdict;
