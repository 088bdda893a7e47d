//! What a module's PTX and ptxas's report say: the constants it publishes, its code without
//! what only locates source text, which instructions it holds, and each entry's registers,
//! stack and spills.

use serde::{Deserialize, Serialize};

/// The value of `__constant__ int NAME` in a module's PTX (0 when it is zero-initialized).
pub fn ptx_constant(ptx: &str, name: &str) -> Result<u32, String> {
    ptx_constant_opt(ptx, name)?
        .ok_or_else(|| format!("the PTX does not define {name}; the kernel must publish it"))
}

/// As [`ptx_constant`], for a constant a kernel may leave out: `None` when no line declares
/// it, an error when one does with a value that is not an unsigned integer (never read as
/// absent).
pub fn ptx_constant_opt(ptx: &str, name: &str) -> Result<Option<u32>, String> {
    let declared = ptx
        .lines()
        .filter(|l| l.trim_start().starts_with(".const") || l.trim_start().starts_with(".global"))
        .find_map(|l| {
            let (_, rest) = l.split_once(name)?;
            let rest = rest.trim_start();
            if rest.starts_with(';') {
                return Some(Some(0));
            }
            // Another constant whose name begins with this one's: not a declaration of it.
            let value = rest.strip_prefix('=')?;
            Some(value.trim().trim_end_matches(';').trim().parse().ok())
        });
    match declared {
        None => Ok(None),
        Some(Some(v)) => Ok(Some(v)),
        Some(None) => Err(format!(
            "the PTX declares {name} with a value that is not an unsigned integer"
        )),
    }
}

/// The PTX without what only locates source text: comments, `.file` and `.loc` directives,
/// blank lines. Two builds of the same code from differently named or commented files give
/// the same text.
pub fn ptx_code(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.lines() {
        let code = line.split("//").next().unwrap_or("").trim();
        if code.is_empty() || code.starts_with(".file") || code.starts_with(".loc") {
            continue;
        }
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Each line's instruction text: its comment cut off, its predicate (`@p`, `@!p`) skipped.
fn instructions(ptx: &str) -> impl Iterator<Item = &str> {
    ptx.lines().map(|line| {
        let code = line.split("//").next().unwrap_or("").trim_start();
        code.strip_prefix('@').map_or(code, |pred| {
            pred.split_once(char::is_whitespace)
                .map_or("", |(_, rest)| rest.trim_start())
        })
    })
}

/// Whether any PTX instruction is a `cp.async` of the Ampere kind (comments and names do not
/// count; the bulk copies of TMA, `cp.async.bulk`, are not).
pub fn ptx_has_cp_async(ptx: &str) -> bool {
    instructions(ptx).any(|code| code.starts_with("cp.async") && !code.starts_with("cp.async.bulk"))
}

/// Whether any PTX instruction's opcode starts with `opcode` (`cp.async` also matches
/// `cp.async.wait_group`; a predicate is skipped; comments and names do not count).
pub fn ptx_has_instruction(ptx: &str, opcode: &str) -> bool {
    instructions(ptx).any(|code| code.starts_with(opcode))
}

/// What ptxas said about one entry function (`--ptxas-options=-v`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PtxasReport {
    pub registers: Option<u32>,
    pub stack_frame_bytes: Option<u32>,
    pub spill_store_bytes: Option<u32>,
    pub spill_load_bytes: Option<u32>,
}

impl PtxasReport {
    /// Parses the lines that follow `Function properties for <entry>` / `Compiling entry
    /// function '<entry>'` in an NVRTC log.
    pub fn parse(log: &str, entry: &str) -> Self {
        let mut report = PtxasReport::default();
        let mut in_entry = false;
        for line in log.lines() {
            if line.contains("Compiling entry function") || line.contains("Function properties for")
            {
                // The exact name: an entry's is a prefix of its companion's (`<entry>_m128`),
                // which the same module's log reports too.
                in_entry = line.contains(&format!("'{entry}'"))
                    || line.trim_end().ends_with(&format!(" {entry}"));
                continue;
            }
            if !in_entry {
                continue;
            }
            if line.contains("stack frame") {
                report.stack_frame_bytes = number_before(line, "bytes stack frame");
                report.spill_store_bytes = number_before(line, "bytes spill stores");
                report.spill_load_bytes = number_before(line, "bytes spill loads");
            }
            if line.contains("registers") {
                report.registers = number_after(line, "Used ");
            }
        }
        report
    }

    pub fn spill_bytes(&self) -> Option<u32> {
        Some(self.spill_store_bytes? + self.spill_load_bytes?)
    }
}

fn number_before(line: &str, marker: &str) -> Option<u32> {
    let before = &line[..line.find(marker)?];
    before
        .split(|c: char| !c.is_ascii_digit())
        .rev()
        .find(|s| !s.is_empty())?
        .parse()
        .ok()
}

fn number_after(line: &str, marker: &str) -> Option<u32> {
    let after = &line[line.find(marker)? + marker.len()..];
    after
        .split(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "ptxas info    : 40 bytes gmem
ptxas info    : Compiling entry function 'other' for 'sm_90'
ptxas info    : Function properties for other
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 200 registers, used 1 barriers
ptxas info    : Compiling entry function 'sdpa_fp8_stage_c_mma' for 'sm_90'
ptxas info    : Function properties for sdpa_fp8_stage_c_mma
ptxas         .     0 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers
";

    #[test]
    fn ptxas_report_is_read_for_the_named_entry_only() {
        let r = PtxasReport::parse(LOG, "sdpa_fp8_stage_c_mma");
        assert_eq!(r.registers, Some(96));
        assert_eq!(
            (r.stack_frame_bytes, r.spill_store_bytes, r.spill_load_bytes),
            (Some(0), Some(12), Some(16))
        );
        assert_eq!(r.spill_bytes(), Some(28));
        assert_eq!(PtxasReport::parse(LOG, "other").registers, Some(200));
    }

    #[test]
    fn an_entrys_report_is_not_its_companions_whose_name_it_begins() {
        // One module's log: the companion `<entry>_m128` is reported first, then the entry.
        let log = "ptxas info    : Compiling entry function 'k_d128_m128' for 'sm_90a'
ptxas info    : Function properties for k_d128_m128
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 80 bytes smem
ptxas info    : Compiling entry function 'k_d128' for 'sm_90a'
ptxas info    : Function properties for k_d128
ptxas         .     0 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 128 registers, used 16 barriers, 80 bytes smem
";
        let entry = PtxasReport::parse(log, "k_d128");
        assert_eq!(
            (entry.registers, entry.spill_bytes()),
            (Some(128), Some(16))
        );
        let companion = PtxasReport::parse(log, "k_d128_m128");
        assert_eq!(
            (companion.registers, companion.spill_bytes()),
            (Some(168), Some(0))
        );
        // Reversed, the entry's figures are still its own.
        let reversed: String = log
            .lines()
            .skip(4)
            .chain(log.lines().take(4))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(PtxasReport::parse(&reversed, "k_d128").registers, Some(128));
    }

    #[test]
    fn cp_async_is_found_in_instructions_not_in_comments() {
        assert!(ptx_has_cp_async(
            "\tcp.async.cg.shared.global [%r1], [%rd2], 16;"
        ));
        assert!(ptx_has_cp_async(
            "\t@%p1 cp.async.ca.shared.global [%r1], [%rd2], 16, 16;"
        ));
        assert!(!ptx_has_cp_async(
            "\t// cp.async would go here\n\tld.global.v4.u32 {%r1}, [%rd1];"
        ));
        assert!(!ptx_has_cp_async(".visible .entry no_cp_async_here()"));
        // TMA's bulk copies are not the Ampere kind; the opcode search still finds them.
        let tma =
            "\t@%p2 cp.async.bulk.tensor.3d.shared::cluster.global [%r1], [%rd1, {%r2}], [%r3];";
        assert!(!ptx_has_cp_async(tma));
        assert!(ptx_has_instruction(tma, "cp.async.bulk.tensor"));
    }

    #[test]
    fn code_identity_ignores_line_information_and_comments_but_not_instructions() {
        let a = "// Generated by NVRTC\n.version 8.8\n.file 1 \"/a/k.cu\"\n.loc 1 10 3\n\
                 add.s32 %r1, %r2, %r3; // x\n";
        let b =
            ".version 8.8\n.file 1 \"/b/renamed.cu\"\n.loc 1 12 3\n\n  add.s32 %r1, %r2, %r3;\n";
        assert_eq!(ptx_code(a), ptx_code(b));
        assert_ne!(ptx_code(a), ptx_code(&b.replace("add.s32", "sub.s32")));
    }
}
