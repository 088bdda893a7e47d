//! `sdpa-runner export --shapes ... --seeds ... DIR`: every (shape, seed) problem as NumPy
//! files any framework reads, and a manifest that describes them (src/exchange/). Written
//! into a staging folder beside DIR and renamed into place at the end: an interrupted or
//! failed export leaves DIR as it was.

use std::collections::{BTreeMap, BTreeSet};

use super::Project;
use crate::cli::ExportArgs;
use crate::error::{AppError, Outcome};
use crate::exchange::{self, ExportedProblem, Manifest};
use crate::outln;
use crate::problem::Problem;
use crate::report::{RunDir, probe_nearest_dir};
use crate::usage::ConfigError;

pub fn export(args: &ExportArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let shapes = project.catalog.select(&args.shapes)?;
    check_target(args)?;
    // One problem held at a time, with no reference rows beyond a sample's.
    crate::rows::check_host_memory(&shapes, crate::rows::CheckRows::Sampled, 1, 1)?;

    let staged = RunDir::for_target(&args.dir)?;
    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    for shape in &shapes {
        for &seed in &args.seeds.0 {
            let p = Problem::new(shape, seed);
            let mut id = exchange::problem_id(shape, seed);
            for n in 2.. {
                if ids.insert(id.clone()) {
                    break;
                }
                id = format!("{}-{n}", exchange::problem_id(shape, seed));
            }
            let mut files = BTreeMap::new();
            for (name, rel, bytes) in exchange::problem_files(&id, &p) {
                crate::report::write_atomic(&staged.staging().join(&rel), &bytes)?;
                files.insert(name, rel.to_string_lossy().replace('\\', "/"));
            }
            outln!("  {id:<44} {}", shape.inline());
            problems.push(ExportedProblem::describe(id, &p, files));
        }
    }
    let count = problems.len();
    staged.write_json(
        exchange::MANIFEST,
        &Manifest {
            format: exchange::FORMAT.into(),
            conventions: exchange::conventions(),
            problems,
        },
    )?;
    let dir = staged.commit()?;
    outln!(
        "export: {count} problems in {} (manifest: {})",
        dir.display(),
        dir.join(exchange::MANIFEST).display()
    );
    Ok(Outcome::Pass)
}

/// Whether `dir` holds an export and nothing else: a manifest of this format, and beside it
/// only the files it lists, in their folders. Anything else in it is someone's, and stays.
fn earlier_export(dir: &std::path::Path) -> Result<(), String> {
    let path = dir.join(exchange::MANIFEST);
    if !path.is_file() {
        return Err(format!("it holds no {}", exchange::MANIFEST));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let manifest: serde_json::Value = serde_json::from_str(&text)
        .map_err(|_| format!("its {} is not an export's", exchange::MANIFEST))?;
    if manifest.get("format").and_then(|f| f.as_str()) != Some(exchange::FORMAT) {
        return Err(format!(
            "its {} does not say `{}`",
            exchange::MANIFEST,
            exchange::FORMAT
        ));
    }
    // Every path the manifest lists (relative to DIR), and the folders that hold them.
    let files: std::collections::BTreeSet<std::path::PathBuf> = manifest
        .get("problems")
        .and_then(|p| p.as_array())
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("files")?.as_object())
        .flat_map(|f| {
            f.values()
                .filter_map(|v| v.as_str())
                .map(std::path::PathBuf::from)
        })
        .collect();
    let folders: std::collections::BTreeSet<&std::path::Path> =
        files.iter().filter_map(|f| f.parent()).collect();
    let listed = |rel: &std::path::Path, is_dir: bool| {
        rel == std::path::Path::new(exchange::MANIFEST)
            || if is_dir {
                folders.contains(rel)
            } else {
                files.contains(rel)
            }
    };
    let mut stack = vec![std::path::PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let here = dir.join(&rel);
        let entries = std::fs::read_dir(&here).map_err(|e| format!("{}: {e}", here.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", here.display()))?;
            let path = rel.join(entry.file_name());
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if !listed(&path, is_dir) {
                return Err(format!(
                    "`{}` in it is not part of the export",
                    path.display()
                ));
            }
            if is_dir {
                stack.push(path);
            }
        }
    }
    Ok(())
}

/// DIR must be new, empty, or replaced on purpose (`--force`), and its parent writable.
fn check_target(args: &ExportArgs) -> Result<(), ConfigError> {
    let dir = &args.dir;
    // The export is renamed into place at the end, and `.` or `..` cannot be renamed: refused
    // before any work, with the folder's own name where it exists.
    let text = dir.to_string_lossy();
    let last = text.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    if last == "." || last == ".." {
        let named = dir
            .canonicalize()
            .map(|p| format!(" (here: {})", p.display()))
            .unwrap_or_default();
        return Err(ConfigError::Usage(format!(
            "{} ends in `{last}`, which an export cannot replace; name the folder itself{named}, \
             from outside it",
            dir.display()
        )));
    }
    if dir.exists() {
        if !dir.is_dir() {
            return Err(ConfigError::Usage(format!(
                "{} is a file, not a folder; choose a folder to export into",
                dir.display()
            )));
        }
        let non_empty = std::fs::read_dir(dir)
            .map_err(|source| ConfigError::Read {
                path: dir.clone(),
                source,
            })?
            .next()
            .is_some();
        if non_empty && !args.force {
            return Err(ConfigError::Usage(format!(
                "{} exists and is not empty; choose a new folder, or pass --force to replace it",
                dir.display()
            )));
        }
        // --force replaces an earlier export, never an unrelated folder.
        if non_empty && let Err(why) = earlier_export(dir) {
            return Err(ConfigError::Usage(format!(
                "{} is not an earlier export ({why}): --force replaces an earlier export only; \
                 choose a new folder",
                dir.display()
            )));
        }
        // The export is renamed into place whole: DIR cannot be the folder the command runs
        // in, or hold it (checked before any work, not found at the end).
        let cwd = std::env::current_dir().and_then(|c| c.canonicalize());
        if let (Ok(target), Ok(cwd)) = (dir.canonicalize(), cwd)
            && cwd.starts_with(&target)
        {
            return Err(ConfigError::Usage(format!(
                "{} is the current folder or holds it, and an export replaces its folder whole; \
                 run the command from outside it",
                dir.display()
            )));
        }
    }
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    probe_nearest_dir(parent).map_err(|e| {
        ConfigError::Usage(format!(
            "cannot export into {}: {e}; choose a folder in a writable place",
            dir.display()
        ))
    })
}
