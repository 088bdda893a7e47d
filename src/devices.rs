//! `--devices`: the GPUs a command runs on, one worker each (docs/DESIGN.md "Several GPUs").
//! What is asked for is checked here against the GPUs the driver sees, before any work.

use std::collections::BTreeSet;

/// `--devices all|0,1,...`; without the flag, GPU 0 alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceChoice {
    /// Every GPU the driver sees (CUDA_VISIBLE_DEVICES applies).
    All,
    /// These CUDA ordinals, in this order. A GPU listed twice gets two workers: allowed only
    /// where nothing is timed.
    List(Vec<usize>),
}

impl Default for DeviceChoice {
    fn default() -> Self {
        DeviceChoice::List(vec![0])
    }
}

impl DeviceChoice {
    /// Parses `all` or a comma-separated list of CUDA ordinals.
    pub fn parse(spec: &str) -> Result<Self, String> {
        if spec.trim() == "all" {
            return Ok(DeviceChoice::All);
        }
        let list = spec
            .split(',')
            .map(|item| {
                item.trim().parse::<usize>().map_err(|_| {
                    format!(
                        "`{item}` in `{spec}` is not a GPU number; write --devices all, or CUDA \
                         ordinals such as 0,1"
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(DeviceChoice::List(list))
    }

    /// As written on the command line.
    pub fn spec(&self) -> String {
        match self {
            DeviceChoice::All => "all".into(),
            DeviceChoice::List(list) => list
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(","),
        }
    }

    /// Whether this choice is the default (GPU 0 alone).
    pub fn is_default(&self) -> bool {
        *self == DeviceChoice::default()
    }
}

/// A GPU as the driver sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuId {
    /// The CUDA ordinal.
    pub ordinal: usize,
    /// The model, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// As nvidia-smi writes it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
}

/// The GPUs `choice` names, one per worker, checked against `seen` (the driver's list):
/// every ordinal exists; a GPU is listed twice only when `timed` is false (two workers on one
/// GPU would time each other's launches); all are of one model (one run's records and
/// timings are of one model; `merge` combines runs of several).
pub fn resolve(choice: &DeviceChoice, seen: &[GpuId], timed: bool) -> Result<Vec<GpuId>, String> {
    let ordinals = match choice {
        DeviceChoice::All => (0..seen.len()).collect(),
        DeviceChoice::List(list) => list.clone(),
    };
    if seen.is_empty() {
        return Err("--devices: the CUDA driver sees no GPU".into());
    }
    let mut chosen = Vec::with_capacity(ordinals.len());
    for &ordinal in &ordinals {
        let gpu = seen.get(ordinal).ok_or_else(|| {
            format!(
                "--devices: there is no GPU {ordinal}; the driver sees {} (0 to {}): {}",
                seen.len(),
                seen.len() - 1,
                listing(seen)
            )
        })?;
        chosen.push(gpu.clone());
    }
    let distinct: BTreeSet<usize> = ordinals.iter().copied().collect();
    if timed && distinct.len() < ordinals.len() {
        return Err(format!(
            "--devices {}: a GPU listed twice gets two workers, whose launches would be timed \
             together; list each GPU once, or check without timing (--iters 0)",
            choice.spec()
        ));
    }
    let models: BTreeSet<&str> = chosen.iter().map(|g| g.name.as_str()).collect();
    if models.len() > 1 {
        return Err(format!(
            "--devices: the GPUs chosen are of {} models ({}); one run's records and timings \
             come from one model. Choose GPUs of one model (--devices 0,1), or run once per \
             model and combine the runs with `sdpa-runner merge`",
            models.len(),
            listing(&chosen)
        ));
    }
    Ok(chosen)
}

fn listing(gpus: &[GpuId]) -> String {
    gpus.iter()
        .map(|g| format!("{} {}", g.ordinal, g.name))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(names: &[&str]) -> Vec<GpuId> {
        names
            .iter()
            .enumerate()
            .map(|(ordinal, name)| GpuId {
                ordinal,
                name: name.to_string(),
                uuid: format!("GPU-{ordinal:08x}"),
            })
            .collect()
    }

    #[test]
    fn all_and_lists_of_ordinals_parse_and_anything_else_is_refused_with_the_forms() {
        assert_eq!(DeviceChoice::parse("all"), Ok(DeviceChoice::All));
        assert_eq!(
            DeviceChoice::parse("1, 0"),
            Ok(DeviceChoice::List(vec![1, 0]))
        );
        for bad in ["", "0,", "gpu1", "-1", "0-3"] {
            let why = DeviceChoice::parse(bad).unwrap_err();
            assert!(why.contains("--devices all"), "{bad}: {why}");
        }
        assert_eq!(DeviceChoice::parse("2,0").unwrap().spec(), "2,0");
        assert_eq!(DeviceChoice::All.spec(), "all");
        assert!(DeviceChoice::default().is_default());
        assert!(!DeviceChoice::All.is_default());
    }

    #[test]
    fn all_takes_every_gpu_in_ordinal_order_and_a_list_keeps_its_order() {
        let seen = gpus(&["H200", "H200", "H200"]);
        let ordinals = |c: &DeviceChoice| -> Vec<usize> {
            resolve(c, &seen, true)
                .unwrap()
                .iter()
                .map(|g| g.ordinal)
                .collect()
        };
        assert_eq!(ordinals(&DeviceChoice::All), [0, 1, 2]);
        assert_eq!(ordinals(&DeviceChoice::List(vec![2, 0])), [2, 0]);
    }

    #[test]
    fn a_missing_gpu_is_refused_naming_the_gpus_there_are() {
        let why = resolve(
            &DeviceChoice::List(vec![0, 2]),
            &gpus(&["H100", "H100"]),
            false,
        )
        .unwrap_err();
        assert!(
            why.contains("no GPU 2") && why.contains("0 to 1") && why.contains("1 H100"),
            "{why}"
        );
        let none = resolve(&DeviceChoice::All, &[], false).unwrap_err();
        assert!(none.contains("sees no GPU"), "{none}");
    }

    #[test]
    fn a_gpu_listed_twice_is_refused_only_when_timed() {
        let seen = gpus(&["H100"]);
        let twice = DeviceChoice::List(vec![0, 0]);
        assert_eq!(resolve(&twice, &seen, false).unwrap().len(), 2);
        let why = resolve(&twice, &seen, true).unwrap_err();
        assert!(why.contains("--iters 0") && why.contains("0,0"), "{why}");
    }

    #[test]
    fn gpus_of_different_models_are_refused_naming_merge() {
        let seen = gpus(&["NVIDIA H100", "NVIDIA H200"]);
        for timed in [false, true] {
            let why = resolve(&DeviceChoice::All, &seen, timed).unwrap_err();
            assert!(
                why.contains("2 models") && why.contains("sdpa-runner merge"),
                "{why}"
            );
        }
        assert!(resolve(&DeviceChoice::List(vec![1]), &seen, true).is_ok());
    }
}
