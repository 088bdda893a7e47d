//! Code identity by content (docs/DESIGN.md "Kernel sources"): two builds are the same code
//! when the source text they compile (the kernel file and every local header it includes),
//! their defines and their compile options (include folders left out) are the same, wherever
//! the files lie. The PTX cannot say it: with `-lineinfo` it carries the file's path.

use super::kernel::KernelSource;
use crate::report::sha256_hex;
pub use crate::schema::CodeIdentity;

/// The identity of `source` built with `defines` (`NAME=VALUE`) and NVRTC `options`.
pub fn identity_of(source: &KernelSource, defines: &[String], options: &[String]) -> CodeIdentity {
    let files: Vec<(String, String)> = closure(source)
        .into_iter()
        .map(|(name, text)| (name, sha256_hex(text.as_bytes())))
        .collect();
    let mut defines = defines.to_vec();
    defines.sort();
    let options: Vec<String> = options
        .iter()
        .filter(|o| !o.starts_with("--include-path=") && !o.starts_with("-D"))
        .cloned()
        .collect();
    let mut all = String::from("sdpa-runner code v1\n");
    // The kernel file's own name does not count (a copy elsewhere is the same code);
    // headers are named as the source includes them.
    for (i, (name, sha)) in files.iter().enumerate() {
        let shown = if i == 0 { "<kernel>" } else { name };
        all.push_str(&format!("file {shown} {sha}\n"));
    }
    for d in &defines {
        all.push_str(&format!("define {d}\n"));
    }
    for o in &options {
        all.push_str(&format!("option {o}\n"));
    }
    CodeIdentity {
        sha256: sha256_hex(all.as_bytes()),
        files,
        defines,
        options,
    }
}

/// The kernel file and the local headers it includes (`#include "NAME"`), recursively, each
/// once: from the source's in-memory headers first (a git revision's), else from its include
/// folders. A header that cannot be found is left out (NVRTC's own error names it).
pub fn closure(source: &KernelSource) -> Vec<(String, String)> {
    let name = source
        .path
        .file_name()
        .map_or_else(|| "kernel".into(), |n| n.to_string_lossy().to_string());
    let mut files = vec![(name, source.text.clone())];
    let mut i = 0;
    while i < files.len() {
        let includes: Vec<String> = local_includes(&files[i].1);
        for inc in includes {
            if files.iter().skip(1).any(|(n, _)| *n == inc) {
                continue;
            }
            let text = source
                .headers
                .iter()
                .find(|(n, _)| *n == inc)
                .map(|(_, t)| t.clone())
                .or_else(|| {
                    source
                        .include_dirs
                        .iter()
                        .find_map(|d| std::fs::read_to_string(d.join(&inc)).ok())
                });
            if let Some(text) = text {
                files.push((inc, text));
            }
        }
        i += 1;
    }
    files
}

/// The names of `#include "NAME"` lines (not `<...>`: the toolkit's, the same for both).
fn local_includes(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim_start().strip_prefix('#'))
        .filter_map(|l| l.trim_start().strip_prefix("include"))
        .filter_map(|l| {
            let l = l.trim_start().strip_prefix('"')?;
            l.split_once('"').map(|(n, _)| n.to_string())
        })
        .collect()
}

/// The first line where the two sources' closures differ, for a report: e.g.
/// `sdpa_fp8_stage_c_mma.cu line 212: `a` -> `b``. `None` when their texts are equal.
pub fn first_difference(cand: &KernelSource, base: &KernelSource) -> Option<String> {
    let (c, b) = (closure(cand), closure(base));
    for (i, (name, text)) in c.iter().enumerate() {
        let theirs = if i == 0 {
            b.first()
        } else {
            b.iter().find(|(n, _)| n == name)
        };
        let Some((_, other)) = theirs else {
            return Some(format!("{name}: included only by the kernel under test"));
        };
        if text == other {
            continue;
        }
        let mut ours = text.lines();
        let mut base_lines = other.lines();
        for line in 1.. {
            match (ours.next(), base_lines.next()) {
                (Some(x), Some(y)) if x == y => continue,
                (x, y) => {
                    let show = |l: Option<&str>| {
                        l.map_or("(end of file)".to_string(), |l| {
                            format!("`{}`", l.trim().chars().take(80).collect::<String>())
                        })
                    };
                    return Some(format!(
                        "{name} line {line}: base {} -> {}",
                        show(y),
                        show(x)
                    ));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn source(dir: &Path, file: &str, text: &str, header: &str) -> KernelSource {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join(file), text).unwrap();
        std::fs::write(dir.join("h.cuh"), header).unwrap();
        KernelSource::load(
            &dir.join(file),
            dir,
            &crate::kernels::project_spec("stage-c"),
        )
        .unwrap()
    }

    const KERNEL: &str = "#include <cuda_fp16.h>\n#include \"h.cuh\"\nint f() { return H; }\n";
    fn opts(dir: &Path) -> Vec<String> {
        vec![
            "--gpu-architecture=sm_90".into(),
            "-lineinfo".into(),
            format!("--include-path={}", dir.display()),
            "-DUSE_CP_ASYNC=1".into(),
        ]
    }

    #[test]
    fn a_byte_identical_copy_at_another_path_is_the_same_code() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("elsewhere/b"));
        let x = source(&a, "k.cu", KERNEL, "#define H 1\n");
        let y = source(&b, "copy.cu", KERNEL, "#define H 1\n");
        let defines = ["USE_CP_ASYNC=1".to_string()];
        let ix = identity_of(&x, &defines, &opts(&a));
        let iy = identity_of(&y, &defines, &opts(&b));
        assert_eq!(ix.sha256, iy.sha256);
        assert!(ix.differences(&iy).is_empty());
        assert_eq!(first_difference(&x, &y), None);
        assert_eq!(
            ix.files.len(),
            2,
            "the header is part of the code: {:?}",
            ix.files
        );
    }

    #[test]
    fn a_changed_header_define_or_option_is_named() {
        let t = tempfile::tempdir().unwrap();
        let (a, b) = (t.path().join("a"), t.path().join("b"));
        let x = source(&a, "k.cu", KERNEL, "#define H 1\n");
        let y = source(&b, "k.cu", KERNEL, "#define H 2\n");
        let d1 = ["USE_CP_ASYNC=1".to_string()];
        let ix = identity_of(&x, &d1, &opts(&a));
        let iy = identity_of(&y, &d1, &opts(&b));
        assert_ne!(ix.sha256, iy.sha256);
        assert_eq!(ix.differences(&iy), ["source: h.cuh differs"]);
        assert_eq!(
            first_difference(&x, &y).unwrap(),
            "h.cuh line 1: base `#define H 2` -> `#define H 1`"
        );
        let d2 = ["USE_CP_ASYNC=1".to_string(), "X=3".to_string()];
        let mut o2 = opts(&a);
        o2.push("-G".into());
        let iz = identity_of(&x, &d2, &o2);
        assert_eq!(
            iz.differences(&ix),
            ["define X=3 only here", "option -G only here"]
        );
    }
}
