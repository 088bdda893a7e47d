//! Exporters: COMPARE.md, JUnit XML and the latency picture, each formatted from results
//! that were decided before them ([`crate::analysis`]). Nothing here decides a verdict.

pub mod grades;
pub mod junit;
pub mod markdown;
pub mod svg;
