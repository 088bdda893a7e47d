//! Merging run directories (shards of a CI job matrix: one job per GPU model or per group of
//! shapes) into one run: the rows of every shard, per GPU model one perf file with the
//! measurements of its shards. Refuses what cannot be one run: different backends or kernels,
//! different inputs for the same (shape, seed), the same (shape, seed, variant, GPU model)
//! twice, different timing plans on one GPU model, timed beside untimed runs. Deciding the
//! merged run is [`crate::analysis`]'s, per GPU model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::analysis::RunMeasured;
use crate::schema::{BuildMeta, CorrectnessFile, CorrectnessRecord, PerfFile, VariantMeta};
use crate::usage::ConfigError;

/// One run directory as it was saved.
#[derive(Debug, Clone)]
pub struct Shard {
    pub path: PathBuf,
    pub meta: BuildMeta,
    pub correctness: CorrectnessFile,
    pub perf: Option<PerfFile>,
}

impl Shard {
    /// Loads a run directory: build_meta.json and correctness.json, and perf.json if timed.
    pub fn load(dir: &Path) -> Result<Self, ConfigError> {
        let file = |name: &str| dir.join(name);
        if !file("correctness.json").is_file() || !file("build_meta.json").is_file() {
            return Err(ConfigError::Usage(format!(
                "{}: not a run directory (no correctness.json and build_meta.json); pass the \
                 directories runs wrote (results/<run>)",
                dir.display()
            )));
        }
        let perf = file("perf.json");
        Ok(Shard {
            path: dir.to_path_buf(),
            meta: crate::schema::read_versioned(&file("build_meta.json"))?,
            correctness: crate::schema::read_versioned(&file("correctness.json"))?,
            perf: if perf.is_file() {
                Some(crate::schema::read_versioned(&perf)?)
            } else {
                None
            },
        })
    }

    /// The GPU model (or CPU) the run measured on.
    pub fn device(&self) -> String {
        if let Some(p) = &self.perf {
            return p.device_name.clone();
        }
        self.meta.backend_details["device"]["name"]
            .as_str()
            .map_or_else(|| format!("{} backend", self.meta.backend), String::from)
    }

    /// The variants the run built: perf.json's, else build_meta.json's identities (enough
    /// to tell the base kernel's from the kernel under test's), else the rows' names.
    fn variants(&self) -> Vec<VariantMeta> {
        if let Some(p) = &self.perf {
            return p.variants.clone();
        }
        if let Some(vs) = self.meta.backend_details["variants"].as_array() {
            return vs
                .iter()
                .map(|v| VariantMeta {
                    name: v["identity"]["name"].as_str().unwrap_or("?").to_string(),
                    kernel: serde_json::from_value(v["identity"]["kernel"].clone()).ok(),
                    ..VariantMeta::default()
                })
                .collect();
        }
        let mut names: Vec<String> = Vec::new();
        for r in &self.correctness.results {
            if !names.contains(&r.variant) {
                names.push(r.variant.clone());
            }
        }
        names
            .into_iter()
            .map(|name| VariantMeta {
                name,
                ..VariantMeta::default()
            })
            .collect()
    }

    /// What each variant was built from, to refuse merging different kernels: the kernel
    /// source's hash and the variant's defines on the GPU, the emulation's parameters on the CPU.
    fn kernel_identity(&self) -> BTreeMap<String, String> {
        let details = &self.meta.backend_details;
        let variants = details["variants"].as_array();
        let mut out = BTreeMap::new();
        match variants {
            Some(vs) => {
                for v in vs {
                    let id = &v["identity"];
                    let source = id["kernel"]["sha256"]
                        .as_str()
                        .or(details["kernel_source"]["sha256"].as_str())
                        .unwrap_or("?");
                    out.insert(
                        id["name"].as_str().unwrap_or("?").to_string(),
                        format!("kernel sha256 {source}, defines {}", id["defines"]),
                    );
                }
            }
            None => {
                let emulation = format!("emulation {details}");
                for r in &self.correctness.results {
                    out.insert(r.variant.clone(), emulation.clone());
                }
            }
        }
        out
    }
}

/// Merges `shards` after checking that they can be one run: per GPU model (in first-seen
/// order) its rows and timings, measured but not yet decided (no comparisons).
pub fn merge(shards: &[Shard]) -> Result<Vec<(String, RunMeasured)>, ConfigError> {
    let refuse = |msg: String| Err(ConfigError::Usage(msg));
    let Some(first) = shards.first() else {
        return refuse("merge needs at least two run directories".into());
    };
    if shards.len() < 2 {
        return refuse("merge needs at least two run directories; one is already a run".into());
    }
    let name = |s: &Shard| s.path.display().to_string();
    for s in shards {
        if s.meta.backend != first.meta.backend {
            return refuse(format!(
                "{} ran on the {} backend and {} on {}; merge runs of one backend",
                name(first),
                first.meta.backend,
                name(s),
                s.meta.backend
            ));
        }
        if s.perf.is_some() != first.perf.is_some() {
            return refuse(format!(
                "{} is {} and {} is not; merge timed runs with timed runs",
                name(first),
                if first.perf.is_some() {
                    "timed"
                } else {
                    "correctness-only"
                },
                name(s)
            ));
        }
    }
    check_kernels(shards)?;
    check_rows(shards)?;
    let mut parts: Vec<(String, RunMeasured)> = Vec::new();
    for s in shards {
        let device = s.device();
        let at = match parts.iter().position(|(d, _)| *d == device) {
            Some(i) => i,
            None => {
                let empty = RunMeasured {
                    backend: first.meta.backend.clone(),
                    variants: Vec::new(),
                    records: Vec::new(),
                    resources: Vec::new(),
                    perf: None,
                    sanitizers: Vec::new(),
                };
                parts.push((device.clone(), empty));
                parts.len() - 1
            }
        };
        let part = &mut parts[at].1;
        for v in s.variants() {
            match part.variants.iter_mut().find(|m| m.name == v.name) {
                None => part.variants.push(v),
                // Shards whose builds of one variant ran other machine code (another NVRTC,
                // other headers) leave it unknown: no comparison may call its sides the same
                // code (src/perf/same_code.rs).
                Some(m) if m.machine_code != v.machine_code => m.machine_code.clear(),
                Some(_) => {}
            }
        }
        part.records
            .extend(s.correctness.results.iter().map(|r| CorrectnessRecord {
                device: Some(device.clone()),
                ..r.clone()
            }));
        part.sanitizers
            .extend(s.correctness.sanitizers.iter().cloned());
        for (v, verdict) in &s.correctness.resources {
            if !part.resources.iter().any(|(n, _)| n == v) {
                part.resources.push((v.clone(), verdict.clone()));
            }
        }
        if let Some(p) = &s.perf {
            match &mut part.perf {
                None => {
                    let mut p = p.clone();
                    p.comparisons.clear();
                    part.perf = Some(p);
                }
                Some(merged) => {
                    if merged.plan != p.plan {
                        return refuse(format!(
                            "{} and another run on {device} were timed with different plans \
                             ({:?} and {:?}); their rounds cannot be pooled, rerun with one plan",
                            name(s),
                            p.plan,
                            merged.plan
                        ));
                    }
                    merged.measurements.extend(p.measurements.iter().cloned());
                    merged.clocks_after = p.clocks_after.clone();
                    for gpu in &p.gpus {
                        if !merged.gpus.contains(gpu) {
                            merged.gpus.push(gpu.clone());
                        }
                    }
                }
            }
        }
    }
    for (_, part) in &mut parts {
        if let Some(p) = &mut part.perf {
            p.variants = part.variants.clone();
        }
    }
    Ok(parts)
}

/// Every variant name means the same build in every shard.
fn check_kernels(shards: &[Shard]) -> Result<(), ConfigError> {
    let mut seen: BTreeMap<String, (String, &Path)> = BTreeMap::new();
    for s in shards {
        for (variant, identity) in s.kernel_identity() {
            match seen.get(&variant) {
                Some((other, path)) if *other != identity => {
                    return Err(ConfigError::Usage(format!(
                        "runs of different kernels: variant {variant} is `{other}` in {} and \
                         `{identity}` in {}; merge shards of one kernel build",
                        path.display(),
                        s.path.display()
                    )));
                }
                Some(_) => {}
                None => {
                    seen.insert(variant, (identity, &s.path));
                }
            }
        }
    }
    Ok(())
}

/// One input per (shape, seed), and no (shape, seed, variant, GPU model) twice.
fn check_rows(shards: &[Shard]) -> Result<(), ConfigError> {
    let mut inputs: BTreeMap<(String, u64), (String, &Path)> = BTreeMap::new();
    let mut rows: BTreeMap<(String, u64, String, String), &Path> = BTreeMap::new();
    for s in shards {
        let device = s.device();
        for r in &s.correctness.results {
            let key = (r.shape.clone(), r.seed);
            match inputs.get(&key) {
                Some((sum, path)) if *sum != r.input_checksum => {
                    return Err(ConfigError::Usage(format!(
                        "shape {} seed {} has different inputs in {} and {} (checksums {}… and \
                         {}…): the runs used different shapes files or generators; merge runs \
                         of one checkout",
                        r.shape,
                        r.seed,
                        path.display(),
                        s.path.display(),
                        &sum[..sum.len().min(12)],
                        &r.input_checksum[..r.input_checksum.len().min(12)]
                    )));
                }
                Some(_) => {}
                None => {
                    inputs.insert(key, (r.input_checksum.clone(), &s.path));
                }
            }
            let row = (r.shape.clone(), r.seed, r.variant.clone(), device.clone());
            if let Some(path) = rows.insert(row, &s.path) {
                return Err(ConfigError::Usage(format!(
                    "shape {} seed {} variant {} on {device} is in {} and in {}: the same row \
                     twice; shard the shapes or seeds so that each row runs once",
                    r.shape,
                    r.seed,
                    r.variant,
                    path.display(),
                    s.path.display()
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A correctness-only GPU shard of a `--base-kernel` run, as build_meta.json records it.
    fn untimed_gpu_shard() -> Shard {
        let identity = |name: &str, role: &str| {
            serde_json::json!({"identity": {"name": name, "defines": [],
                "kernel": {"role": role, "source": "k.cu", "sha256": "ab"}}})
        };
        let meta = serde_json::json!({
            "schema_version": crate::schema::SCHEMA_VERSION,
            "tool": {"name": "sdpa-runner", "version": "0"},
            "git": {"sha": "x", "dirty": false}, "backend": "cuda",
            "host": {"hostname": "h", "os": "linux", "arch": "x86_64", "logical_cpus": 1},
            "command_line": [], "started_at": "t", "project_root": "/",
            "shapes_file": {"path": "s", "sha256": "s"}, "gates_file": {"path": "g", "sha256": "g"},
            "backend_details": {"device": {"name": "NVIDIA H200"},
                "variants": [identity("cp0", "candidate"), identity("base-cp0", "base")]},
        });
        Shard {
            path: "run".into(),
            meta: serde_json::from_value(meta).unwrap(),
            correctness: CorrectnessFile {
                schema_version: crate::schema::SCHEMA_VERSION,
                all_pass: true,
                backend: "cuda".into(),
                resources: Default::default(),
                results: Vec::new(),
                sanitizers: Vec::new(),
            },
            perf: None,
        }
    }

    #[test]
    fn an_untimed_shard_names_its_device_and_its_base_variants_from_build_meta() {
        let shard = untimed_gpu_shard();
        assert_eq!(shard.device(), "NVIDIA H200");
        let roles: Vec<(String, bool)> = shard
            .variants()
            .into_iter()
            .map(|v| (v.name.clone(), v.is_base()))
            .collect();
        assert_eq!(
            roles,
            [("cp0".to_string(), false), ("base-cp0".to_string(), true)]
        );
    }

    #[test]
    fn timed_shards_of_one_model_list_every_gpu_they_ran_on() {
        let slot = |index: usize| crate::schema::GpuSlot {
            index,
            uuid: format!("GPU-{index}"),
        };
        let timed = |seed: u64, gpus: Vec<crate::schema::GpuSlot>| {
            let mut perf = crate::perf::fixtures::perf_file(
                "NVIDIA H200",
                &["mission"],
                &[seed],
                &[("cp0", 1.0), ("cp1", 0.9)],
            );
            perf.gpus = gpus;
            Shard {
                path: format!("run{seed}").into(),
                perf: Some(perf),
                ..untimed_gpu_shard()
            }
        };
        let merged = merge(&[
            timed(0, vec![slot(0), slot(1)]),
            timed(1, vec![slot(1), slot(2)]),
        ])
        .unwrap();
        let perf = merged[0].1.perf.as_ref().unwrap();
        assert_eq!(perf.gpus, [slot(0), slot(1), slot(2)]);
        assert_eq!(perf.measurements.len(), 4);
    }

    #[test]
    fn shards_whose_builds_ran_other_machine_code_leave_it_unknown() {
        let code = |sha: &str| crate::schema::FunctionCode {
            module: "d64".into(),
            function: "f".into(),
            sha256: sha.into(),
        };
        let timed = |seed: u64, sha: &str| {
            let mut perf = crate::perf::fixtures::perf_file(
                "NVIDIA H200",
                &["mission"],
                &[seed],
                &[("cp0", 1.0), ("cp1", 0.9)],
            );
            for v in &mut perf.variants {
                v.machine_code = vec![code(sha)];
            }
            Shard {
                path: format!("run{seed}").into(),
                perf: Some(perf),
                ..untimed_gpu_shard()
            }
        };
        let codes = |shards: &[Shard]| -> Vec<usize> {
            let merged = merge(shards).unwrap();
            let perf = merged[0].1.perf.as_ref().unwrap();
            perf.variants.iter().map(|v| v.machine_code.len()).collect()
        };
        assert_eq!(
            codes(&[timed(0, "a"), timed(1, "a")]),
            [1, 1],
            "kept where they agree"
        );
        assert_eq!(
            codes(&[timed(0, "a"), timed(1, "b")]),
            [0, 0],
            "unknown where not"
        );
    }
}
