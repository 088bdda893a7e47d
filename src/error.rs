//! The one place where outcomes and errors become exit codes (docs/DESIGN.md "Exit codes").

use crate::backend::BackendError;
use crate::report::ReportError;
use crate::usage::ConfigError;

/// All gates passed.
pub const EXIT_PASS: u8 = 0;
/// A gate failed: correctness, resources or performance.
pub const EXIT_GATE_FAILED: u8 = 1;
/// Usage or configuration error: bad flag, unknown shape, malformed JSON, unusable results dir.
pub const EXIT_USAGE: u8 = 2;
/// Environment error: no GPU, driver, NVRTC or CUDA headers, or the runner's own f64 reference
/// kernel failed (never [`EXIT_KERNEL`]: that is the kernel under test's).
pub const EXIT_ENVIRONMENT: u8 = 3;
/// The kernel failed to compile, is not the variant asked for, or faulted at run time.
pub const EXIT_KERNEL: u8 = 4;

/// How a command that ran to the end came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    GateFailed,
}

impl Outcome {
    pub fn from_pass(pass: bool) -> Self {
        if pass {
            Outcome::Pass
        } else {
            Outcome::GateFailed
        }
    }

    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Pass => EXIT_PASS,
            Outcome::GateFailed => EXIT_GATE_FAILED,
        }
    }
}

/// A command that could not run to the end.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl AppError {
    pub fn exit_code(&self) -> u8 {
        match self {
            AppError::Config(_) | AppError::Report(_) => EXIT_USAGE,
            AppError::Backend(BackendError::Config(_)) => EXIT_USAGE,
            AppError::Backend(BackendError::Environment(_)) => EXIT_ENVIRONMENT,
            AppError::Backend(BackendError::Kernel(_)) => EXIT_KERNEL,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_layer_maps_to_its_documented_exit_code() {
        assert_eq!(
            AppError::from(ConfigError::Usage("x".into())).exit_code(),
            2
        );
        let report = ReportError::Unwritable {
            path: "r".into(),
            source: std::io::Error::other("ro"),
        };
        assert_eq!(AppError::from(report).exit_code(), 2);
        assert_eq!(
            AppError::from(BackendError::Config("x".into())).exit_code(),
            2
        );
        assert_eq!(
            AppError::from(BackendError::Environment("x".into())).exit_code(),
            3
        );
        assert_eq!(
            AppError::from(BackendError::Kernel("x".into())).exit_code(),
            4
        );
        assert_eq!(Outcome::Pass.exit_code(), 0);
        assert_eq!(Outcome::GateFailed.exit_code(), 1);
    }
}
