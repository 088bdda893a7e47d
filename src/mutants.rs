//! Planted bugs for the self-test: a `MUTANT_*` define of a kernel, which variants and shapes
//! expose it (each kernel lists its own in cuda/kernels.toml), and the stripper that removes
//! the mutant blocks from the source so the self-test can prove the clean build does not
//! depend on them.

/// One planted bug, as its kernel's manifest entry lists it (cuda/kernels.toml
/// `[[kernel.mutants]]`).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mutant {
    pub define: String,
    /// What it breaks, in a few words.
    pub breaks: String,
    /// Only the candidate variant has the code it changes (Stage C: cp.async).
    #[serde(default)]
    pub candidate_only: bool,
    /// Shapes most likely to expose it; the first is the one the sanitizers run on.
    pub shapes: String,
    /// Run only when named with `selftest --only`: its shape is too heavy for every self-test.
    #[serde(default)]
    pub opt_in: bool,
    /// Test hooks (defines that are no bug, such as Stage C's TMA_ISSUE_LATE) its checks build
    /// with: they widen the window a race needs, so that results show it. The clean kernel
    /// with the same hooks must pass the correctness gates first (not stress or the
    /// sanitizers), so a catch by the gates is the mutant's.
    #[serde(default)]
    pub hooks: Vec<String>,
}

/// Removes every `#ifdef MUTANT_*` / `#ifndef MUTANT_*` block, keeping the branch a build
/// without MUTANT defines compiles. Removed lines become empty lines, so line numbers, and
/// with them the PTX's line info, stay the same.
pub fn strip(source: &str) -> Result<String, String> {
    /// An open conditional: a mutant block (and whether its current branch is kept) or another.
    enum Frame {
        Mutant { keep: bool },
        Other,
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut out = Vec::new();
    for (n, line) in source.lines().enumerate() {
        let directive = line.trim_start();
        let kept = stack
            .iter()
            .all(|f| !matches!(f, Frame::Mutant { keep: false }));
        // `#ifdef MUTANT_X` starts with the mutant branch (dropped), `#ifndef` with the clean one.
        let mutant_if = directive
            .strip_prefix("#ifdef ")
            .map(|d| (d, false))
            .or_else(|| directive.strip_prefix("#ifndef ").map(|d| (d, true)))
            .filter(|(d, _)| d.trim().starts_with("MUTANT_"));
        if let Some((_, keep)) = mutant_if {
            stack.push(Frame::Mutant { keep });
            out.push("");
            continue;
        }
        if directive.starts_with("#if") {
            stack.push(Frame::Other);
        } else if directive.starts_with("#else") || directive.starts_with("#elif") {
            if let Some(Frame::Mutant { keep }) = stack.last_mut() {
                if directive.starts_with("#elif") {
                    return Err(format!(
                        "line {}: #elif in a mutant block is not supported",
                        n + 1
                    ));
                }
                *keep = !*keep;
                out.push("");
                continue;
            }
        } else if directive.starts_with("#endif") {
            match stack.pop() {
                Some(Frame::Mutant { .. }) => {
                    out.push("");
                    continue;
                }
                Some(Frame::Other) => {}
                None => return Err(format!("line {}: #endif without #if", n + 1)),
            }
        }
        out.push(if kept { line } else { "" });
    }
    if !stack.is_empty() {
        return Err("a conditional block is not closed".into());
    }
    let mut text = out.join("\n");
    if source.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutant_blocks_go_and_their_clean_branch_stays_on_the_same_line() {
        let src =
            "a\n#ifdef MUTANT_X\nbad\n#else\ngood\n#endif\n#ifndef MUTANT_Y\nwait\n#endif\nz\n";
        let out = strip(src).unwrap();
        assert_eq!(out, "a\n\n\n\ngood\n\n\nwait\n\nz\n");
        assert_eq!(out.lines().count(), src.lines().count());
    }

    #[test]
    fn other_conditionals_are_kept_even_inside_mutant_blocks() {
        let src = "#if USE_CP_ASYNC\n#ifdef MUTANT_X\n#if 1\nm\n#endif\n#else\nc\n#endif\nx\n#else\ny\n#endif\n";
        assert_eq!(
            strip(src).unwrap(),
            "#if USE_CP_ASYNC\n\n\n\n\n\nc\n\nx\n#else\ny\n#endif\n"
        );
    }

    #[test]
    fn unbalanced_conditionals_are_an_error() {
        assert!(strip("#ifdef MUTANT_X\nx\n").is_err());
        assert!(strip("x\n#endif\n").is_err());
    }

    #[test]
    fn every_shipped_kernel_has_a_block_for_each_of_its_mutants_and_strips_cleanly() {
        let cuda = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda");
        for name in ["stage-c", "stage-d"] {
            let spec = crate::kernels::project_spec(name);
            let src = std::fs::read_to_string(cuda.join(&spec.source)).unwrap();
            assert!(!spec.mutants.is_empty(), "{name} lists its planted bugs");
            for m in &spec.mutants {
                assert!(
                    src.contains(&format!("#ifdef {}", m.define))
                        || src.contains(&format!("#ifndef {}", m.define)),
                    "{name}: {}",
                    m.define
                );
                // A hook the source never tests would leave its mutant's race shut.
                for hook in &m.hooks {
                    let hook = hook.split('=').next().unwrap_or(hook);
                    assert!(
                        src.contains(&format!("#ifdef {hook}"))
                            || src.contains(&format!("#ifndef {hook}")),
                        "{name}: {}'s hook {hook}",
                        m.define
                    );
                }
            }
            let stripped = strip(&src).unwrap();
            let directives = |t: &str| {
                t.lines()
                    .filter(|l| l.trim_start().starts_with('#') && l.contains("MUTANT_"))
                    .count()
            };
            assert_eq!(directives(&stripped), 0, "{name}");
            assert!(directives(&src) >= spec.mutants.len(), "{name}");
            assert_eq!(stripped.lines().count(), src.lines().count(), "{name}");
        }
    }
}
