//! Run-time compilation with NVRTC (through cudarc): source + options -> PTX, CUBIN and the
//! compiler log, which includes ptxas's resource report (`--ptxas-options=-v`).
//!
//! Compiling for a real architecture (`sm_90`) gives both the PTX (hashed and inspected for
//! variant identity) and the CUBIN ptxas made from it (loaded as is, so what runs is exactly
//! what was inspected and reported).

use std::ffi::{CStr, CString, c_char};
use std::path::Path;

use cudarc::nvrtc::{result, sys};

/// The output of one successful compilation.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub ptx: String,
    pub cubin: Vec<u8>,
    pub log: String,
    pub options: Vec<String>,
}

/// A failed compilation: NVRTC's status, the options used and the full log.
#[derive(Debug, Clone)]
pub struct CompileFailure {
    pub status: String,
    pub options: Vec<String>,
    pub log: String,
}

impl std::fmt::Display for CompileFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "NVRTC failed ({}) with options {}\n--- NVRTC log ---\n{}",
            self.status,
            self.options.join(" "),
            self.log.trim_end()
        )
    }
}

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn is_available() -> bool {
    unsafe { sys::is_culib_present() }
}

/// NVRTC's version, e.g. (13, 0). Call only when [`is_available`].
pub fn version() -> Option<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (status == sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// The options of one compilation, in a fixed order so they can be recorded and compared.
pub fn build_options(
    arch: &str,
    include_dirs: &[&Path],
    defines: &[(String, String)],
) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
        "-lineinfo".to_string(),
        "--ptxas-options=-v".to_string(),
    ];
    for dir in include_dirs {
        opts.push(format!("--include-path={}", dir.display()));
    }
    for (name, value) in defines {
        opts.push(if value.is_empty() {
            format!("-D{name}")
        } else {
            format!("-D{name}={value}")
        });
    }
    opts
}

/// Compiles `source` (named `name` in diagnostics). Call only when [`is_available`].
pub fn compile(source: &str, name: &str, options: &[String]) -> Result<Compiled, CompileFailure> {
    compile_with_headers(source, name, &[], options)
}

/// Compiles `source` with `headers` ((include name, text)) given to NVRTC in memory: an
/// `#include "NAME"` resolves to them before any include path.
pub fn compile_with_headers(
    source: &str,
    name: &str,
    headers: &[(String, String)],
    options: &[String],
) -> Result<Compiled, CompileFailure> {
    let fail = |status: String, log: String| CompileFailure {
        status,
        options: options.to_vec(),
        log,
    };
    let nul = |what: &str| fail(format!("{what} contains a NUL byte"), String::new());
    let src = CString::new(source).map_err(|_| nul("the source"))?;
    let cname = CString::new(name).unwrap_or_else(|_| CString::new("kernel.cu").unwrap());
    let mut texts = Vec::with_capacity(headers.len());
    let mut names = Vec::with_capacity(headers.len());
    for (include, text) in headers {
        names.push(CString::new(include.as_str()).map_err(|_| nul("a header name"))?);
        texts.push(CString::new(text.as_str()).map_err(|_| nul("a header"))?);
    }
    let text_ptrs: Vec<*const c_char> = texts.iter().map(|t| t.as_ptr()).collect();
    let name_ptrs: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let mut prog = std::mem::MaybeUninit::uninit();
    // SAFETY: every pointer outlives the call; NVRTC copies the strings.
    let status = unsafe {
        sys::nvrtcCreateProgram(
            prog.as_mut_ptr(),
            src.as_ptr(),
            cname.as_ptr(),
            headers.len() as i32,
            if headers.is_empty() {
                std::ptr::null()
            } else {
                text_ptrs.as_ptr()
            },
            if headers.is_empty() {
                std::ptr::null()
            } else {
                name_ptrs.as_ptr()
            },
        )
    };
    if status != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(fail(format!("{status:?}"), String::new()));
    }
    // SAFETY: initialized by the successful call above.
    let program = Program(unsafe { prog.assume_init() });
    let started = std::time::Instant::now();
    let compiled = unsafe { result::compile_program(program.0, options) };
    crate::trace::mark(|| format!("nvrtc {name}: {:.3} s", started.elapsed().as_secs_f64()));
    let log = unsafe { result::get_program_log(program.0) }
        .map(|raw| c_chars_to_string(&raw))
        .unwrap_or_default();
    if let Err(e) = compiled {
        return Err(fail(format!("{e:?}"), log));
    }
    let ptx = unsafe { result::get_ptx(program.0) }
        .map(|raw| c_chars_to_string(&raw))
        .map_err(|e| fail(format!("getting PTX: {e:?}"), log.clone()))?;
    let cubin =
        get_cubin(program.0).map_err(|e| fail(format!("getting CUBIN: {e:?}"), log.clone()))?;
    Ok(Compiled {
        ptx,
        cubin,
        log,
        options: options.to_vec(),
    })
}

/// Destroys the NVRTC program when dropped.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn get_cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, sys::nvrtcResult> {
    let mut size = 0usize;
    let status = unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) };
    if status != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(status);
    }
    let mut buf = vec![0u8; size];
    let status = unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char) };
    if status != sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(status);
    }
    Ok(buf)
}

fn c_chars_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw.iter().map(|&c| c as u8).collect();
    match CStr::from_bytes_until_nul(&bytes) {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_carry_arch_includes_and_defines_in_order() {
        let opts = build_options(
            "sm_90",
            &[Path::new("/cuda/include"), Path::new("/repo/cuda")],
            &[
                ("USE_CP_ASYNC".into(), "1".into()),
                ("FLAG".into(), String::new()),
            ],
        );
        assert_eq!(
            opts,
            [
                "--gpu-architecture=sm_90",
                "-std=c++17",
                "-lineinfo",
                "--ptxas-options=-v",
                "--include-path=/cuda/include",
                "--include-path=/repo/cuda",
                "-DUSE_CP_ASYNC=1",
                "-DFLAG",
            ]
        );
    }
}
