//! The instruction-set level the CPU kernels run at, chosen once per process
//! at run time from what the CPU reports, never from what the build machine
//! had.
//!
//! `SLUICE_CPU_KERNELS` can lower it (`portable` runs the plain paths: our
//! reference code for the encoder's attention and GELU, candle's kernels for
//! the matrix products), which is how the tests run every level a machine
//! offers. It can never raise the level above what the CPU has: a request for
//! more is capped, and the cap is logged.

use std::sync::OnceLock;

/// The variable that forces a level: `auto` (the default), `avx512`, `avx2`
/// or `portable`.
pub const KERNELS_ENV: &str = "SLUICE_CPU_KERNELS";

/// The SIMD levels the kernels are written for, lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KernelLevel {
    /// No SIMD kernels of ours: plain Rust and candle's own kernels.
    Portable,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// x86-64 with AVX-512F besides AVX2 and FMA: the f32 kernels on 16
    /// lanes; the quantized products on 512-bit vectors where the CPU also
    /// has AVX-512BW (and VNNI's `vpdpbusd` where it has that), else AVX2's.
    Avx512,
}

impl KernelLevel {
    pub fn name(self) -> &'static str {
        match self {
            KernelLevel::Portable => "portable",
            KernelLevel::Avx2 => "avx2",
            KernelLevel::Avx512 => "avx512",
        }
    }

    /// The highest level this CPU runs.
    pub fn detected() -> KernelLevel {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 =
                std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
            if avx2 && std::is_x86_feature_detected!("avx512f") {
                return KernelLevel::Avx512;
            }
            if avx2 {
                return KernelLevel::Avx2;
            }
        }
        KernelLevel::Portable
    }
}

/// The level chosen for this process, and why, if it is not the detected one.
#[derive(Clone, Debug)]
pub struct Choice {
    pub level: KernelLevel,
    pub detected: KernelLevel,
    /// Set when the environment asked for something other than `auto`.
    pub note: Option<String>,
}

/// Resolves a `SLUICE_CPU_KERNELS` value against the detected level.
pub fn resolve(requested: Option<&str>, detected: KernelLevel) -> Choice {
    let asked = match requested.map(str::trim) {
        None | Some("") | Some("auto") => None,
        Some("portable") => Some(KernelLevel::Portable),
        Some("avx2") => Some(KernelLevel::Avx2),
        Some("avx512") => Some(KernelLevel::Avx512),
        Some(other) => {
            return Choice {
                level: detected,
                detected,
                note: Some(format!(
                    "{KERNELS_ENV}={other:?} is not a level (auto, avx512, avx2, portable); using {}",
                    detected.name()
                )),
            };
        }
    };
    match asked {
        None => Choice {
            level: detected,
            detected,
            note: None,
        },
        Some(level) if level <= detected => Choice {
            level,
            detected,
            note: Some(format!("{KERNELS_ENV} forces {}", level.name())),
        },
        Some(level) => Choice {
            level: detected,
            detected,
            note: Some(format!(
                "{KERNELS_ENV} asks for {} but this CPU runs at most {}",
                level.name(),
                detected.name()
            )),
        },
    }
}

/// The choice for this process (read once).
pub fn choice() -> &'static Choice {
    static CHOICE: OnceLock<Choice> = OnceLock::new();
    CHOICE.get_or_init(|| {
        let requested = std::env::var(KERNELS_ENV).ok();
        resolve(requested.as_deref(), KernelLevel::detected())
    })
}

/// The level the kernels run at in this process.
pub fn level() -> KernelLevel {
    choice().level
}

/// Every level this process may run, lowest first: up to the chosen one
/// (the tests hold each to the plain-Rust references).
pub fn levels() -> Vec<KernelLevel> {
    [
        KernelLevel::Portable,
        KernelLevel::Avx2,
        KernelLevel::Avx512,
    ]
    .into_iter()
    .filter(|l| *l <= level())
    .collect()
}

/// Whether the CPU is AMD's (CPUID leaf 0's vendor string `AuthenticAMD`):
/// the bf16 rule of [`crate::encoder::bf16_by_rule`] differs by vendor,
/// since their cores differ in how many 512-bit FMAs they issue.
pub fn is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let leaf = std::arch::x86_64::__cpuid(0);
        let mut vendor = [0u8; 12];
        vendor[..4].copy_from_slice(&leaf.ebx.to_le_bytes());
        vendor[4..8].copy_from_slice(&leaf.edx.to_le_bytes());
        vendor[8..].copy_from_slice(&leaf.ecx.to_le_bytes());
        &vendor == b"AuthenticAMD"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The host CPU as a figure should name it: its model, family and model
/// numbers, and the SIMD flags the kernels care about (from `/proc/cpuinfo`;
/// empty fields where it cannot be read).
pub fn describe() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_default()
    };
    let flags = field("flags");
    let wanted = [
        "avx2",
        "fma",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_vnni",
        "avx512_bf16",
        "amx_tile",
    ];
    let have: Vec<&str> = wanted
        .into_iter()
        .filter(|f| flags.split_whitespace().any(|x| x == *f))
        .collect();
    format!(
        "{} (family {} model {}), flags: {}",
        field("model name"),
        field("cpu family"),
        field("model\t"),
        have.join(" ")
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_level_can_be_lowered_but_never_raised() {
        use KernelLevel::*;
        assert_eq!(resolve(None, Avx2).level, Avx2);
        assert!(resolve(Some("auto"), Avx2).note.is_none());
        assert_eq!(resolve(Some("portable"), Avx2).level, Portable);
        assert_eq!(resolve(Some("avx2"), Avx2).level, Avx2);
        let capped = resolve(Some("avx2"), Portable);
        assert_eq!(capped.level, Portable);
        assert!(capped.note.unwrap().contains("at most portable"));
        assert_eq!(resolve(Some("avx2"), Avx512).level, Avx2);
        let capped = resolve(Some("avx512"), Avx2);
        assert_eq!(capped.level, Avx2);
        assert!(capped.note.unwrap().contains("at most avx2"));
        let unknown = resolve(Some("avx9000"), Avx2);
        assert_eq!(unknown.level, Avx2);
        assert!(unknown.note.unwrap().contains("is not a level"));
    }
}
