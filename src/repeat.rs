//! Stress: relaunch a variant many times on the same inputs, each launch into a freshly
//! poisoned output, and demand the output bit-identical to the first every time. A pipeline
//! race that one run survives by luck shows up here as a divergent repeat. A kernel that runs
//! two launch geometries (query tiles) runs every other serial repeat at the one not chosen.

use half::f16;

use crate::backend::{Backend, BackendError};
use crate::gates::Gates;
use crate::problem::Problem;
use crate::runner::{Yardsticks, judge_output};
use crate::schema::{Divergence, StressMode, StressRecord};

/// Runs `repeats` repeats of `variant` on the loaded problem `p`.
pub fn stress_variant(
    backend: &mut dyn Backend,
    variant: usize,
    p: &Problem,
    y: &Yardsticks,
    gates: &Gates,
    repeats: usize,
    mode: StressMode,
) -> Result<StressRecord, BackendError> {
    let name = backend.variants()[variant].clone();
    let backend_name = backend.name();
    let mut failed = Vec::new();
    let judge = |out: &[f16], repeat: usize, failed: &mut Vec<String>| {
        let r = judge_output(backend_name, &name, p, y, out, gates);
        for f in crate::verdict::failed(&r.gates) {
            failed.push(format!("repeat {repeat}: {f}"));
        }
    };
    let first = backend.launch_poisoned(variant)?;
    judge(&first, 0, &mut failed);
    let (mut divergent, mut first_divergence, mut launches) = (0, None, 1);
    for repeat in 1..repeats {
        let outs: Vec<Vec<f16>> = match mode {
            // Every other serial repeat at the entry's other launch geometry, where it runs
            // one (src/backend/mod.rs `other_geometries`): both owe the first launch's bits.
            StressMode::Serial if repeat % 2 == 1 => match backend.other_geometries(variant)? {
                others if others.is_empty() => vec![backend.launch_poisoned(variant)?],
                others => others,
            },
            StressMode::Serial => vec![backend.launch_poisoned(variant)?],
            StressMode::TwoStreams => backend.run_concurrent(variant)?.into(),
        };
        launches += outs.len();
        let mut diverged = false;
        for out in &outs {
            if let Some(i) = first
                .iter()
                .zip(out)
                .position(|(a, b)| a.to_bits() != b.to_bits())
            {
                diverged = true;
                first_divergence.get_or_insert(Divergence {
                    repeat,
                    at: crate::metrics::unflatten(i, &p.shape),
                    expected_bits: first[i].to_bits(),
                    got_bits: out[i].to_bits(),
                });
                judge(out, repeat, &mut failed);
            }
        }
        divergent += usize::from(diverged);
    }
    Ok(StressRecord {
        shape: p.shape.name.clone(),
        seed: p.seed,
        variant: name,
        mode,
        repeats,
        launches,
        divergent_repeats: divergent,
        pass: divergent == 0 && failed.is_empty(),
        first_divergence,
        failed_gates: failed,
        references: y.engine.to_string(),
        emulation: y.emulation_engine.to_string(),
        gpu: backend.gpu(),
    })
}

/// One console line, e.g. `[mission] seed=0 cp1 two-streams 1000 repeats (1999 launches): 0 divergent, gates PASS`.
pub fn line(r: &StressRecord, w: &crate::console::Widths) -> String {
    let mut s = format!(
        "[{:<ws$}] seed={} {:<wv$} {:<11} {} repeats ({} launches): {} divergent",
        r.shape,
        r.seed,
        r.variant,
        serde_json::to_value(r.mode)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default(),
        r.repeats,
        r.launches,
        r.divergent_repeats,
        ws = w.shape,
        wv = w.variant
    );
    if let Some(d) = &r.first_divergence {
        s.push_str(&format!(
            ", first at repeat {} (b={}, h={}, s={}, d={}: {:#06x} != {:#06x})",
            d.repeat, d.at[0], d.at[1], d.at[2], d.at[3], d.got_bits, d.expected_bits
        ));
    }
    s.push_str(if r.failed_gates.is_empty() {
        ", gates PASS"
    } else {
        ", gates FAIL"
    });
    s.push_str(if r.pass { "  PASS" } else { "  FAIL" });
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::emulation::Defect;
    use crate::shapes::Shape;

    fn setup() -> (Problem, Yardsticks, Gates) {
        let shape = Shape {
            name: "t".into(),
            b: 1,
            h: 2,
            s: 40,
            d: 64,
            qk_std: 1.0,
            purpose: String::new(),
            dist: Default::default(),
            rotate: false,
            hkv: 2,
            sk: 40,
            causal: false,
        };
        let p = Problem::new(&shape, 0);
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("gates/default.json");
        let gates = crate::gates::GateFile::load(&path).unwrap().gates;
        let y = Yardsticks::full(&p, crate::emulation::Algorithm::STAGE_C);
        (p, y, gates)
    }

    #[test]
    fn a_deterministic_backend_never_diverges_in_either_mode() {
        let (p, y, gates) = setup();
        let mut b = CpuBackend::new(Defect::None);
        b.load(&p).unwrap();
        for mode in [StressMode::Serial, StressMode::TwoStreams] {
            let r = stress_variant(&mut b, 0, &p, &y, &gates, 5, mode).unwrap();
            assert!(r.pass && r.divergent_repeats == 0, "{r:?}");
        }
        let r = stress_variant(&mut b, 0, &p, &y, &gates, 5, StressMode::TwoStreams).unwrap();
        assert_eq!(r.launches, 1 + 4 * 2);
    }

    /// A backend whose every third run leaves one element unwritten: a stand-in for a race.
    /// With `other_geometry`, its entry runs a second launch geometry that leaves that element
    /// unwritten every time.
    struct Flaky {
        inner: CpuBackend,
        runs: usize,
        other_geometry: Option<usize>,
    }

    impl Backend for Flaky {
        fn name(&self) -> &'static str {
            "cpu"
        }
        fn variants(&self) -> &[String] {
            self.inner.variants()
        }
        fn load(&mut self, p: &Problem) -> Result<(), BackendError> {
            self.inner.load(p)
        }
        fn launch_poisoned(&mut self, v: usize) -> Result<Vec<f16>, BackendError> {
            let mut out = self.inner.launch_poisoned(v)?;
            self.runs += 1;
            if self.runs.is_multiple_of(3) {
                out[64 * 5 + 7] = crate::metrics::POISON;
            }
            Ok(out)
        }
        fn other_geometries(&mut self, v: usize) -> Result<Vec<Vec<f16>>, BackendError> {
            let Some(at) = self.other_geometry else {
                return Ok(Vec::new());
            };
            let mut out = self.inner.launch_poisoned(v)?;
            out[at] = crate::metrics::POISON;
            Ok(vec![out])
        }
        fn warm_up(&mut self, _: usize, _: usize) -> Result<(), BackendError> {
            Ok(())
        }
        fn time_samples(
            &mut self,
            _: usize,
            _: usize,
            _: &crate::timing::TimingPlan,
        ) -> Result<crate::timing::TimedBlock, BackendError> {
            Ok(Default::default())
        }
        fn clock(&self) -> &'static str {
            "none"
        }
        fn device_name(&self) -> String {
            "test".into()
        }
        fn device_json(&self) -> serde_json::Value {
            serde_json::Value::Null
        }
        fn details(&self) -> serde_json::Value {
            serde_json::Value::Null
        }
        fn describe(&self) -> String {
            String::new()
        }
    }

    #[test]
    fn an_intermittent_bad_output_is_counted_located_and_fails() {
        let (p, y, gates) = setup();
        let mut b = Flaky {
            inner: CpuBackend::new(Defect::None),
            runs: 0,
            other_geometry: None,
        };
        b.load(&p).unwrap();
        let r = stress_variant(&mut b, 0, &p, &y, &gates, 10, StressMode::Serial).unwrap();
        assert!(!r.pass);
        assert_eq!(r.divergent_repeats, 3, "runs 3, 6 and 9 of 10");
        let d = r.first_divergence.unwrap();
        assert_eq!(
            (d.repeat, d.at, d.got_bits),
            (2, [0, 0, 5, 7], crate::metrics::POISON.to_bits())
        );
        assert!(
            r.failed_gates.iter().any(|g| g.contains("unwritten")),
            "{:?}",
            r.failed_gates
        );
    }

    #[test]
    fn a_serial_stress_runs_every_other_repeat_at_the_other_launch_geometry() {
        let (p, y, gates) = setup();
        let mut b = Flaky {
            inner: CpuBackend::new(Defect::None),
            runs: 0,
            other_geometry: Some(64 * 9 + 3),
        };
        b.load(&p).unwrap();
        // Only the other geometry's output is wrong (the chosen one never: 2 runs of it in 4).
        let r = stress_variant(&mut b, 0, &p, &y, &gates, 4, StressMode::Serial).unwrap();
        assert!(!r.pass);
        assert_eq!(r.divergent_repeats, 2, "repeats 1 and 3");
        let d = r.first_divergence.unwrap();
        assert_eq!((d.repeat, d.at), (1, [0, 0, 9, 3]));
    }
}
