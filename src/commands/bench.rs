//! `sdpa-runner bench`: times the f64 CPU reference and, when python3 and numpy are present,
//! the same math in numpy (scripts/bench_reference_numpy.py), side by side.

use std::process::Command;
use std::time::Instant;

use super::Project;
use crate::cli::BenchArgs;
use crate::error::{AppError, Outcome};
use crate::problem::Problem;
use crate::reference;
use crate::shapes::Shape;
use crate::usage::ConfigError;

/// The goal of the foundation issue: at most half numpy's time on the same machine.
const GOAL_RATIO: f64 = 0.5;

pub fn bench(args: &BenchArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let selected = project.catalog.select(&args.shapes)?;
    if let Some(other) = selected.iter().find(|s| !s.is_plain()) {
        return Err(ConfigError::Usage(format!(
            "bench times the textbook f64 reference of plain attention (H_kv = H, S_k = S, no \
             mask); `{}` is {}: choose plain shapes",
            other.name,
            other.dims()
        ))
        .into());
    }
    // Every row of every shape, on one worker with every thread.
    crate::rows::check_host_memory(&selected, crate::rows::CheckRows::All, 1, 1)?;
    let repeats = args.repeats as usize;
    crate::outln!(
        "f64 reference softmax(scale·QKᵀ)V, median of {repeats} runs after one warm-up, {} threads",
        rayon::current_num_threads()
    );
    let numpy = if args.no_numpy {
        Err("skipped (--no-numpy)".to_string())
    } else {
        numpy_times(
            &project.root.scripts_dir().join("bench_reference_numpy.py"),
            &selected,
            repeats,
        )
    };
    let width = selected
        .iter()
        .map(|s| s.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    crate::outln!(
        "{:<width$}  {:>14}  {:>10}  {:>10}  {:>11}",
        "shape",
        "BxHxSxD",
        "ours ms",
        "numpy ms",
        "ours/numpy"
    );
    for shape in &selected {
        let ours = time_reference(shape, repeats);
        let theirs = numpy
            .as_ref()
            .ok()
            .and_then(|m| m.get(&shape.name).and_then(|v| v.as_f64()));
        let (theirs_s, ratio_s) = match theirs {
            Some(t) => (
                format!("{t:.1}"),
                format!(
                    "{:.2}{}",
                    ours / t,
                    if ours / t <= GOAL_RATIO {
                        ""
                    } else {
                        " (goal 0.5)"
                    }
                ),
            ),
            None => ("-".into(), "-".into()),
        };
        crate::outln!(
            "{:<width$}  {:>14}  {:>10.1}  {:>10}  {:>11}",
            shape.name,
            shape.dims(),
            ours,
            theirs_s,
            ratio_s
        );
    }
    if let Err(why) = &numpy {
        crate::outln!("numpy: {why}");
    }
    Ok(Outcome::Pass)
}

/// Median milliseconds of the kernel reference on seed 0's dequantized inputs.
fn time_reference(shape: &Shape, repeats: usize) -> f64 {
    let p = Problem::new(shape, 0);
    let (q, k, v) = (
        p.q.dequantize_f64(),
        p.k.dequantize_f64(),
        p.v.dequantize_f64(),
    );
    let scale = p.softmax_scale as f64;
    let _warm = reference::attention(shape, &q, &k, &v, scale);
    let mut times: Vec<f64> = (0..repeats)
        .map(|_| {
            let t = Instant::now();
            let out = reference::attention(shape, &q, &k, &v, scale);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            std::hint::black_box(out);
            ms
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// How long the numpy comparison may take before it is given up (a hung python3 must not
/// hang the bench): far beyond numpy's few seconds on `long`.
const NUMPY_TIME_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs `cmd` to completion, or kills it after `limit`.
fn output_within(
    cmd: &mut Command,
    limit: std::time::Duration,
) -> Result<std::process::Output, String> {
    use std::io::Read;
    use wait_timeout::ChildExt;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("not run: python3 unavailable ({e})"))?;
    // Drain both pipes on threads so a chatty child cannot block on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let status = match child
        .wait_timeout(limit)
        .map_err(|e| format!("not run: {e}"))?
    {
        Some(status) => status,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "not run: python3 did not finish within {} s and was stopped",
                limit.as_secs()
            ));
        }
    };
    Ok(std::process::Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// Runs the numpy script; a JSON object of shape name -> median ms, or why there is none.
fn numpy_times(
    script: &std::path::Path,
    shapes: &[Shape],
    repeats: usize,
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut cmd = Command::new("python3");
    cmd.arg(script)
        .arg("--json")
        .arg("--repeats")
        .arg(repeats.to_string());
    for s in shapes {
        cmd.arg("--shape").arg(format!("{}={}", s.name, s.dims()));
    }
    let out = output_within(&mut cmd, NUMPY_TIME_LIMIT)?;
    if !out.status.success() {
        let why = String::from_utf8_lossy(&out.stderr);
        return Err(format!("not run: {}", why.trim()));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("unreadable output from {}: {e}", script.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_hung_child_is_stopped_at_its_time_limit() {
        let started = std::time::Instant::now();
        let err = super::output_within(
            std::process::Command::new("sleep").arg("30"),
            std::time::Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(err.contains("did not finish"), "{err}");
        assert!(started.elapsed().as_secs() < 10);
    }
}
