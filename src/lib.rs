//! sdpa-runner: tells a kernel engineer whether a change to the Stage-C FP8 attention kernel
//! is still correct, and lets CI refuse it when it is not.
//!
//! Data flows one way: shape + seed -> [`inputs`] -> [`fp8`] quantization ([`problem`]) ->
//! a [`backend`] run -> [`metrics`] against the [`reference`]s and the [`emulation`] ->
//! [`verdict`]s from the [`gates`] -> [`report`] files. [`commands`] wires it to the [`cli`],
//! and [`error`] turns outcomes into exit codes.

pub mod backend;
pub mod cli;
pub mod clocks;
pub mod commands;
pub mod config;
pub mod console;
pub mod emulation;
pub mod error;
pub mod fp8;
pub mod gates;
pub mod inputs;
pub mod json;
pub mod metrics;
pub mod mutants;
pub mod paths;
pub mod perf;
pub mod problem;
pub mod progress;
pub mod reference;
pub mod report;
pub mod runner;
pub mod shapes;
pub mod stats;
pub mod stress;
pub mod timing;
pub mod verdict;
