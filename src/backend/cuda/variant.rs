//! Kernel variants: which build-time defines each one gets (the kernel's A/B switch from
//! cuda/kernels.toml first), and which ones a run selects from `--cp-async` and the
//! `USE_CP_ASYNC` environment variable (baseline, candidate or both, whatever the switch).

use serde::{Deserialize, Serialize};

use crate::kernels::{VariantSwitch, VariantValue};
use crate::schema::{BASE_PREFIX, KernelRole};
use crate::usage::ConfigError;

/// `--cp-async`: which variants to build and run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CpAsyncChoice {
    /// Only the synchronous-load variant (cp0).
    #[value(name = "0")]
    Off,
    /// Only the cp.async pipeline variant (cp1).
    #[value(name = "1")]
    On,
    /// Both, cp0 as baseline and cp1 as candidate.
    Both,
}

/// One variant: its name and every define it is compiled with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantSpec {
    pub name: String,
    /// The switch's candidate value (Stage C: cp.async on), not the baseline's.
    #[serde(alias = "use_cp_async")]
    pub candidate: bool,
    /// `(NAME, VALUE)` pairs passed as `-DNAME=VALUE`; the kernel's switch first.
    pub defines: Vec<(String, String)>,
    /// Built from the kernel under test, or from `--base-kernel`.
    #[serde(default)]
    pub role: KernelRole,
}

impl VariantSpec {
    /// Stage C's variants (cp0, cp1: `USE_CP_ASYNC`), as its manifest entry names them.
    pub fn new(use_cp_async: bool, extra_defines: &[(String, String)]) -> Self {
        let stage_c = VariantSwitch {
            define: "USE_CP_ASYNC".into(),
            baseline: VariantValue {
                name: "cp0".into(),
                value: "0".into(),
            },
            candidate: VariantValue {
                name: "cp1".into(),
                value: "1".into(),
            },
            proof_instruction: Some("cp.async".into()),
            proof_constant: "SDPA_USE_CP_ASYNC".into(),
        };
        Self::of_switch(&stage_c, use_cp_async, extra_defines)
    }

    /// The baseline or the candidate of a kernel's A/B switch (cuda/kernels.toml `[variants]`).
    pub fn of_switch(
        switch: &VariantSwitch,
        candidate: bool,
        extra_defines: &[(String, String)],
    ) -> Self {
        let chosen = if candidate {
            &switch.candidate
        } else {
            &switch.baseline
        };
        let mut defines = vec![(switch.define.clone(), chosen.value.clone())];
        defines.extend_from_slice(extra_defines);
        VariantSpec {
            name: chosen.name.clone(),
            candidate,
            defines,
            role: KernelRole::Candidate,
        }
    }

    /// The same variant built from the base kernel, named `base-<name>`: a run with
    /// `--base-kernel` pairs `cp0` with `base-cp0`.
    pub fn of_base(&self) -> Self {
        VariantSpec {
            name: format!("{BASE_PREFIX}{}", self.name),
            role: KernelRole::Base,
            ..self.clone()
        }
    }

    /// The same variant plus `extra` defines, named after them, e.g. `cp1+SDPA_DELAY_CYCLES=900`.
    pub fn with_candidate_defines(&self, extra: &[(String, String)]) -> Self {
        let mut v = self.clone();
        v.defines.extend_from_slice(extra);
        for (n, val) in extra {
            v.name.push('+');
            v.name.push_str(&if val.is_empty() {
                n.clone()
            } else {
                format!("{n}={val}")
            });
        }
        v
    }

    /// The defines as they appear on a command line, e.g. `USE_CP_ASYNC=1`.
    pub fn define_strings(&self) -> Vec<String> {
        self.defines
            .iter()
            .map(|(n, v)| {
                if v.is_empty() {
                    n.clone()
                } else {
                    format!("{n}={v}")
                }
            })
            .collect()
    }
}

/// Resolves the variants of a run. `USE_CP_ASYNC=0|1` in the environment restricts the run to
/// that variant (the old two-run workflow); a `--cp-async` flag that disagrees is an error.
pub fn select(flag: Option<CpAsyncChoice>, env: Option<&str>) -> Result<Vec<bool>, ConfigError> {
    let from_env = match env {
        None => None,
        Some("0") => Some(CpAsyncChoice::Off),
        Some("1") => Some(CpAsyncChoice::On),
        Some(other) => {
            return Err(ConfigError::Usage(format!(
                "USE_CP_ASYNC=`{other}` in the environment: use 0 or 1, or unset it"
            )));
        }
    };
    let choice = match (flag, from_env) {
        (Some(f), Some(e)) if f != e => {
            return Err(ConfigError::Usage(format!(
                "--cp-async {} disagrees with USE_CP_ASYNC={} in the environment; drop one of them",
                name(f),
                name(e)
            )));
        }
        (Some(f), _) => f,
        (None, Some(e)) => e,
        (None, None) => CpAsyncChoice::Both,
    };
    Ok(match choice {
        CpAsyncChoice::Off => vec![false],
        CpAsyncChoice::On => vec![true],
        CpAsyncChoice::Both => vec![false, true],
    })
}

fn name(c: CpAsyncChoice) -> &'static str {
    match c {
        CpAsyncChoice::Off => "0",
        CpAsyncChoice::On => "1",
        CpAsyncChoice::Both => "both",
    }
}

/// Parses `--define NAME[=VALUE]`. USE_CP_ASYNC is refused: `--cp-async` owns it.
pub fn parse_define(text: &str) -> Result<(String, String), String> {
    let (name, value) = text.split_once('=').unwrap_or((text, ""));
    let valid = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(format!(
            "`{name}` is not a C identifier; write --define NAME or NAME=VALUE"
        ));
    }
    if name == "USE_CP_ASYNC" {
        return Err("USE_CP_ASYNC is chosen with --cp-async 0|1|both, not --define".into());
    }
    if value.chars().any(|c| c.is_whitespace()) {
        return Err(format!("the value of {name} must not contain spaces"));
    }
    Ok((name.to_string(), value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_both_variants_baseline_first() {
        assert_eq!(select(None, None).unwrap(), vec![false, true]);
    }

    #[test]
    fn environment_restricts_to_one_variant() {
        assert_eq!(select(None, Some("1")).unwrap(), vec![true]);
        assert_eq!(select(None, Some("0")).unwrap(), vec![false]);
        assert_eq!(
            select(Some(CpAsyncChoice::On), Some("1")).unwrap(),
            vec![true]
        );
    }

    #[test]
    fn a_flag_that_disagrees_with_the_environment_is_refused() {
        let err = select(Some(CpAsyncChoice::Both), Some("1"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--cp-async both") && err.contains("USE_CP_ASYNC=1"),
            "{err}"
        );
    }

    #[test]
    fn a_malformed_environment_value_is_refused_by_name() {
        let err = select(None, Some("yes")).unwrap_err().to_string();
        assert!(err.contains("USE_CP_ASYNC=`yes`"), "{err}");
    }

    #[test]
    fn variant_names_and_defines_say_which_is_which() {
        let v = VariantSpec::new(true, &[("SDPA_DELAY_NS".into(), "500".into())]);
        assert_eq!(v.name, "cp1");
        assert_eq!(v.define_strings(), ["USE_CP_ASYNC=1", "SDPA_DELAY_NS=500"]);
        assert_eq!(
            VariantSpec::new(false, &[]).define_strings(),
            ["USE_CP_ASYNC=0"]
        );
    }

    #[test]
    fn a_candidate_define_makes_a_second_named_variant() {
        let base = VariantSpec::new(true, &[]);
        let cand = base.with_candidate_defines(&[("SDPA_DELAY_CYCLES".into(), "900".into())]);
        assert_eq!(cand.name, "cp1+SDPA_DELAY_CYCLES=900");
        assert!(cand.candidate);
        assert_eq!(
            cand.define_strings(),
            ["USE_CP_ASYNC=1", "SDPA_DELAY_CYCLES=900"]
        );
    }

    #[test]
    fn defines_are_checked() {
        assert_eq!(parse_define("A_B=3").unwrap(), ("A_B".into(), "3".into()));
        assert_eq!(
            parse_define("FLAG").unwrap(),
            ("FLAG".into(), String::new())
        );
        assert!(parse_define("USE_CP_ASYNC=1").is_err());
        assert!(parse_define("9X=1").is_err());
        assert!(parse_define("A-B").is_err());
    }
}
