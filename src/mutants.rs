//! Planted bugs for the self-test: the catalog of `MUTANT_*` defines in the kernel, which
//! variants and shapes expose each, and the stripper that removes the mutant blocks from the
//! source so the self-test can prove the clean build does not depend on them.

/// One planted bug.
#[derive(Debug, Clone, Copy)]
pub struct Mutant {
    pub define: &'static str,
    /// What it breaks, in a few words.
    pub breaks: &'static str,
    /// Only the cp.async variant has the code it changes.
    pub cp_async_only: bool,
    /// Shapes most likely to expose it; the first is the one the sanitizers run on.
    pub shapes: &'static str,
    /// Run only when named with `selftest --only`: its shape is too heavy for every self-test.
    pub opt_in: bool,
}

/// The default self-test problems of the configurations' bugs (GQA, S_q != S_k, causal, D 128).
pub const CONFIG_SHAPES: &str = "cfg-chunk,cfg-decode,cfg-tall";

pub const MUTANTS: &[Mutant] = &[
    Mutant {
        define: "MUTANT_SKIP_CP_WAIT",
        breaks: "skips the cp.async wait before reading a stage",
        cp_async_only: true,
        shapes: "mission,partial300",
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_WRONG_STAGE",
        breaks: "reads a stage still being filled, not the landed one",
        cp_async_only: true,
        shapes: "mission,partial300",
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_NO_DEQUANT_BARRIER",
        breaks: "drops the barrier after a step's codes land in shared memory",
        cp_async_only: false,
        shapes: "mission,long",
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_NO_PARTIAL_MASK",
        breaks: "no mask on the partial last KV tile",
        cp_async_only: false,
        shapes: "partial77,single",
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_SKIP_LAST_KV_TILE",
        breaks: "never processes the last KV tile",
        cp_async_only: false,
        shapes: "partial77,mission",
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_NO_RESCALE",
        breaks: "drops the online-softmax rescale",
        cp_async_only: false,
        shapes: "wide,mission",
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_STORE_ROW_OFF_BY_ONE",
        breaks: "stores every row one row down",
        cp_async_only: false,
        shapes: "small",
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_K_SCALE_TWICE",
        breaks: "applies the K scale twice",
        cp_async_only: false,
        shapes: "small",
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_K_READ_PAST_END",
        breaks: "reads one byte past the end of K",
        cp_async_only: false,
        // Not `small`: its 2048-byte K ends where the next allocation begins, so the stray
        // byte lands in valid memory and memcheck cannot see it; partial77's 9856 bytes do not.
        shapes: "partial77",
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_Q_READ_PAST_END",
        breaks: "reads query row S_q, one past the end (the output does not change)",
        cp_async_only: false,
        // partial77: the last head's row 77 lies past Q's 9856 bytes, in memcheck's padding.
        shapes: "partial77",
        opt_in: false,
    },
    // The configurations' bugs, each on the same default self-test problems (shapes/default.json:
    // cfg-chunk, chunked prefill of 77 queries against 300 keys, GQA 2:1, D 128, causal;
    // cfg-decode, 3 queries against 300 keys, GQA 4:1, D 64; cfg-tall, 200 causal queries
    // against 70 keys, the first 130 of which see none), not on a problem chosen per bug.
    Mutant {
        define: "MUTANT_CAUSAL_DIAG_OFF_BY_ONE",
        breaks: "the causal mask shifted by one: each row's diagonal key masked",
        cp_async_only: false,
        shapes: CONFIG_SHAPES,
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_CAUSAL_TOP_LEFT",
        breaks: "the causal mask aligned top-left instead of bottom-right",
        cp_async_only: false,
        shapes: CONFIG_SHAPES,
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_CAUSAL_SKIP_EARLY",
        breaks: "the causal tile skip one KV tile too early",
        cp_async_only: false,
        shapes: CONFIG_SHAPES,
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_GQA_MODULO",
        breaks: "query head h reads K/V head h % H_kv, not h / (H / H_kv)",
        cp_async_only: false,
        shapes: CONFIG_SHAPES,
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_D128_HALF_STRIDE",
        breaks: "the second half of D = 128 read with the first half's offset",
        cp_async_only: false,
        shapes: CONFIG_SHAPES,
        opt_in: false,
    },
    Mutant {
        define: "MUTANT_I32_HEAD_OFFSET",
        breaks: "computes the head offset in 32 bits",
        cp_async_only: false,
        // Only past 2^31 elements does the product wrap: 24.4 GiB of inputs, so opt-in.
        shapes: "index64",
        opt_in: true,
    },
];

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
    fn the_shipped_kernel_has_a_block_for_every_mutant_and_strips_cleanly() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda/sdpa_fp8_stage_c_mma.cu");
        let src = std::fs::read_to_string(path).unwrap();
        for m in MUTANTS {
            assert!(
                src.contains(&format!("#ifdef {}", m.define))
                    || src.contains(&format!("#ifndef {}", m.define)),
                "{}",
                m.define
            );
        }
        let stripped = strip(&src).unwrap();
        let directives = |t: &str| {
            t.lines()
                .filter(|l| l.trim_start().starts_with('#') && l.contains("MUTANT_"))
                .count()
        };
        assert_eq!(directives(&stripped), 0);
        assert!(directives(&src) >= MUTANTS.len());
        assert_eq!(stripped.lines().count(), src.lines().count());
    }
}
