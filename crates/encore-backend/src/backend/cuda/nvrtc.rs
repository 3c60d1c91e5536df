//! Kernel compilation: every `.cu` file in `crates/encore-backend/kernels/` (embedded in the
//! binary) is compiled with NVRTC for the device's architecture at start-up, straight to
//! a cubin, and cached on disk keyed by a hash of the source, the options and the NVRTC
//! version. Nothing is compiled lazily: all modules are loaded before the first step.
//!
//! This module needs only NVRTC, not a GPU, so CI can compile every kernel.

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::time::Instant;

use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys};
use rayon::prelude::*;

use super::kernels::{KernelSource, COMMON, SOURCES};
use crate::error::{Error, Result};

/// One compiled kernel file.
pub struct CompiledModule {
    pub file: &'static str,
    pub functions: &'static [&'static str],
    pub cubin: Vec<u8>,
    /// Whether the cubin came from the disk cache.
    pub cached: bool,
    /// NVRTC's log of a successful compile (warnings); empty when clean or cached.
    pub log: String,
    pub seconds: f64,
}

/// What compiling all kernels took.
#[derive(Clone, Debug, Default)]
pub struct CompileReport {
    pub arch: String,
    pub nvrtc_version: (i32, i32),
    pub files: usize,
    pub functions: usize,
    pub cache_hits: usize,
    pub seconds: f64,
    pub cache_dir: Option<PathBuf>,
}

/// Whether libnvrtc can be loaded (cudarc panics on first use otherwise).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { nvrtc_sys::is_culib_present() }
}

pub fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| Error::cuda("nvrtcVersion", e))?;
    Ok((major, minor))
}

/// The directory holding `cuda_bf16.h` / `cuda_fp16.h`: `$CUDA_INCLUDE`, else
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`, `/opt/cuda/include`.
pub fn find_cuda_include() -> Result<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("CUDA_INCLUDE") {
        candidates.push(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(p) = std::env::var_os(var) {
            candidates.push(PathBuf::from(p).join("include"));
        }
    }
    candidates.push(PathBuf::from("/usr/local/cuda/include"));
    candidates.push(PathBuf::from("/opt/cuda/include"));
    for c in &candidates {
        if c.join("cuda_bf16.h").is_file() && c.join("cuda_fp16.h").is_file() {
            return Ok(c.clone());
        }
    }
    let tried: Vec<String> = candidates
        .iter()
        .map(|c| c.join("cuda_bf16.h").display().to_string())
        .collect();
    Err(Error::DeviceUnavailable {
        device: "cuda".into(),
        why: format!(
            "NVRTC needs cuda_bf16.h and cuda_fp16.h; none found at {} (set CUDA_HOME or CUDA_INCLUDE)",
            tried.join(", ")
        ),
    })
}

/// Where compiled kernels are cached: `$ENCORE_CACHE_DIR/kernels`, else
/// `$XDG_CACHE_HOME/encore/kernels`, else `$HOME/.cache/encore/kernels`. `None` when no
/// location is known or `ENCORE_KERNEL_CACHE=off`.
pub fn cache_dir() -> Option<PathBuf> {
    if std::env::var("ENCORE_KERNEL_CACHE").is_ok_and(|v| v == "off" || v == "0") {
        return None;
    }
    let base = std::env::var_os("ENCORE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|p| PathBuf::from(p).join("encore")))
        .or_else(|| std::env::var_os("HOME").map(|p| PathBuf::from(p).join(".cache/encore")))?;
    Some(base.join("kernels"))
}

/// FNV-1a, 64 bit: a stable hash for cache keys (std's hasher is not stable across Rust
/// versions).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn options(arch: &str, include: &Path) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        format!("-I{}", include.display()),
    ];
    // Kernel variants for measurements (`NAME=VALUE ...`); part of the cache key.
    o.extend(
        kernel_defines()
            .into_iter()
            .map(|(k, v)| format!("-D{k}={v}")),
    );
    o
}

/// `ENCORE_KERNEL_DEFINES`: `NAME=VALUE` pairs (space-separated) passed to every kernel
/// file, for measuring variants of a kernel without a rebuild.
pub fn kernel_defines() -> Vec<(String, String)> {
    std::env::var("ENCORE_KERNEL_DEFINES")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The value of kernel define `name` in `ENCORE_KERNEL_DEFINES`, or `default` (for the
/// host's mirror of a kernel's compile-time shape).
pub fn kernel_define(name: &str, default: usize) -> usize {
    kernel_defines()
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(default)
}

/// Compile every kernel file for `arch` (e.g. `sm_90`), using the disk cache.
pub fn compile_all(arch: &str) -> Result<(Vec<CompiledModule>, CompileReport)> {
    let start = Instant::now();
    let include = find_cuda_include()?;
    let version = nvrtc_version()?;
    let opts = options(arch, &include);
    let dir = cache_dir();
    if let Some(d) = &dir {
        // A cache we cannot create is not an error: we compile every time instead.
        if let Err(e) = std::fs::create_dir_all(d) {
            tracing::warn!("kernel cache {} unusable: {e}", d.display());
        }
    }
    // Files compile in parallel (NVRTC programs are independent; the largest files take
    // seconds each), in SOURCES order.
    let modules = SOURCES
        .par_iter()
        .map(|source| compile_one(source, arch, &opts, version, dir.as_deref()))
        .collect::<Result<Vec<_>>>()?;
    let report = CompileReport {
        arch: arch.to_string(),
        nvrtc_version: version,
        files: modules.len(),
        functions: modules.iter().map(|m| m.functions.len()).sum(),
        cache_hits: modules.iter().filter(|m| m.cached).count(),
        seconds: start.elapsed().as_secs_f64(),
        cache_dir: dir,
    };
    Ok((modules, report))
}

fn compile_one(
    source: &KernelSource,
    arch: &str,
    opts: &[String],
    version: (i32, i32),
    dir: Option<&Path>,
) -> Result<CompiledModule> {
    let start = Instant::now();
    let key = fnv1a(&[
        COMMON.as_bytes(),
        source.src.as_bytes(),
        opts.join(" ").as_bytes(),
        format!("{version:?}").as_bytes(),
    ]);
    let stem = source.file.trim_end_matches(".cu");
    let path = dir.map(|d| d.join(format!("{stem}-{key:016x}-{arch}.cubin")));
    if let Some(p) = &path {
        if let Ok(cubin) = std::fs::read(p) {
            if !cubin.is_empty() {
                return Ok(CompiledModule {
                    file: source.file,
                    functions: source.functions,
                    cubin,
                    cached: true,
                    log: String::new(),
                    seconds: start.elapsed().as_secs_f64(),
                });
            }
        }
    }
    let (cubin, log) = compile_source(source.file, &format!("{COMMON}\n{}", source.src), opts)?;
    if let Some(p) = &path {
        // Write to a temporary name then rename, so a concurrent reader never sees half a file.
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&tmp, &cubin)
            .and_then(|_| std::fs::rename(&tmp, p))
            .is_err()
        {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!("could not write kernel cache entry {}", p.display());
        }
    }
    Ok(CompiledModule {
        file: source.file,
        functions: source.functions,
        cubin,
        cached: false,
        log,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Compile one translation unit to a cubin and NVRTC's log (warnings, usually empty); a
/// failure carries the log.
fn compile_source(file: &str, src: &str, opts: &[String]) -> Result<(Vec<u8>, String)> {
    let c_src = CString::new(src).map_err(|_| Error::KernelCompile {
        file: file.into(),
        log: "source contains a NUL byte".into(),
    })?;
    let c_name = CString::new(file).expect("kernel file names have no NUL");
    let prog = nvrtc::create_program(&c_src, Some(&c_name))
        .map_err(|e| Error::cuda("nvrtcCreateProgram", e))?;
    // SAFETY: `prog` was just created and is destroyed exactly once below.
    let result = unsafe {
        let compiled = nvrtc::compile_program(prog, opts);
        let log = nvrtc::get_program_log(prog)
            .map(|l| c_chars_to_string(&l))
            .unwrap_or_default();
        let out = match compiled {
            Err(_) => Err(Error::KernelCompile {
                file: file.into(),
                log,
            }),
            Ok(()) => {
                if !log.trim().is_empty() {
                    tracing::debug!("nvrtc log for {file}: {log}");
                }
                get_cubin(prog)
                    .map(|cubin| (cubin, log))
                    .map_err(|e| Error::cuda("nvrtcGetCUBIN", e))
            }
        };
        let _ = nvrtc::destroy_program(prog);
        out
    };
    result
}

/// # Safety
/// `prog` must be a successfully compiled, live program.
unsafe fn get_cubin(
    prog: nvrtc_sys::nvrtcProgram,
) -> std::result::Result<Vec<u8>, nvrtc::NvrtcError> {
    let mut size = 0usize;
    nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
    let mut buf = vec![0u8; size];
    nvrtc_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char).result()?;
    Ok(buf)
}

fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SOURCES lists exactly the `.cu` files of `kernels/`, each once.
    #[test]
    fn sources_match_the_kernel_files() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".cu"))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = SOURCES.iter().map(|s| s.file.to_string()).collect();
        listed.sort();
        assert_eq!(
            listed,
            on_disk,
            "SOURCES in kernels/sources.rs against {}",
            dir.display()
        );
    }

    #[test]
    fn fnv_is_stable_and_separates_parts() {
        assert_eq!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"ab", b"c"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }

    /// Every kernel definition (a macro's counts once) waits for its predecessor first.
    #[test]
    fn every_kernel_waits_for_the_one_before_it() {
        // Every kernel is launched with programmatic dependent launch, so it may start
        // before its predecessor finished: each `extern "C"` kernel's first statement is
        // `pdl_enter()`, or a gemv body that calls it after its first weight loads.
        let waiting_bodies = [
            (
                "gemv_impl<",
                SOURCES.iter().find(|s| s.file == "gemv.cu").unwrap().src,
            ),
            ("qgemv_impl<", COMMON),
            (
                "marlin_impl<",
                SOURCES
                    .iter()
                    .find(|s| s.file == "quant_marlin.cu")
                    .unwrap()
                    .src,
            ),
        ];
        for (call, text) in waiting_bodies {
            let name = call.trim_end_matches('<');
            let at = text
                .find(&format!("void {name}("))
                .unwrap_or_else(|| panic!("{name} not found"));
            let end = at + text[at..].find("\n}\n").unwrap();
            assert!(
                text[at..end].contains("pdl_enter();"),
                "{name} does not wait"
            );
        }
        // The pushed all-reduce's norm waits on its data instead, then lets the next
        // kernel launch (allreduce.cu).
        let waits_on_data = "pushed_rms_norm_impl<";
        let allreduce = SOURCES
            .iter()
            .find(|s| s.file == "allreduce.cu")
            .unwrap()
            .src;
        let at = allreduce.find("void pushed_rms_norm_impl(").unwrap();
        let end = at + allreduce[at..].find("\n}\n").unwrap();
        assert!(allreduce[at..end].contains("griddepcontrol.launch_dependents"));
        let mut kernels = 0;
        for src in SOURCES {
            for (i, _) in src.src.match_indices("extern \"C\" __global__") {
                let open = i + src.src[i..].find('{').unwrap();
                let first = src.src[open + 1..]
                    .trim_start_matches(|c: char| c.is_whitespace() || c == '\\');
                assert!(
                    first.starts_with("pdl_enter();")
                        || first.starts_with(waits_on_data)
                        || waiting_bodies
                            .iter()
                            .any(|(call, _)| first.starts_with(call)),
                    "{}: the kernel at byte {i} does not start with pdl_enter(): {}",
                    src.file,
                    &first[..first.len().min(60)]
                );
                kernels += 1;
            }
        }
        assert!(kernels > 20, "{kernels} kernel definitions found");
    }

    /// Every kernel file compiles for sm_90. Runs wherever NVRTC and the CUDA headers are
    /// found (CI installs the NVRTC 13.0 wheel and sets ENCORE_REQUIRE_NVRTC=1 so that a
    /// missing library fails instead of skipping).
    #[test]
    fn all_kernels_compile_for_sm90() {
        let required = std::env::var("ENCORE_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        if !nvrtc_present() || find_cuda_include().is_err() {
            assert!(
                !required,
                "ENCORE_REQUIRE_NVRTC=1 but NVRTC or the CUDA headers are missing"
            );
            eprintln!("skipping: NVRTC or CUDA headers not found");
            return;
        }
        let dir = std::env::temp_dir().join(format!("encore-nvrtc-test-{}", std::process::id()));
        std::env::set_var("ENCORE_CACHE_DIR", &dir);
        let (mods, report) = compile_all("sm_90a").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(mods.len(), SOURCES.len());
        assert!(mods.iter().all(|m| !m.cubin.is_empty() && !m.cached));
        assert_eq!(report.cache_hits, 0);
        // Warnings count as errors.
        for m in &mods {
            assert!(
                m.log.trim().is_empty(),
                "NVRTC warned on {}:\n{}",
                m.file,
                m.log
            );
        }
        // Every listed entry point is defined: an extern "C" name sits NUL-terminated in
        // the cubin's string table.
        for m in &mods {
            for f in m.functions {
                let name = format!("{f}\0");
                assert!(
                    m.cubin.windows(name.len()).any(|w| w == name.as_bytes()),
                    "{} does not define {f} (listed in SOURCES)",
                    m.file
                );
            }
        }
        // A second compile is served from the cache, byte for byte.
        let (again, report) = compile_all("sm_90a").unwrap();
        assert_eq!(report.cache_hits, SOURCES.len());
        for (a, b) in mods.iter().zip(&again) {
            assert_eq!(a.cubin, b.cubin, "{}", a.file);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
