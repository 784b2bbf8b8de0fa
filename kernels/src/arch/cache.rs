//! Cache sizes of the CPU the process runs on, read once: the input of every block size (see
//! `gemm::blocking` and `attention::blocking`, which derive their sizes from a [`CacheSizes`]
//! with pure functions, so any configuration can be tested on one machine).
//!
//! Sources, first that answers: Linux sysfs (`/sys/devices/system/cpu/cpu0/cache/index*/`:
//! `level`, `type`, `size`), then CPUID (leaf 4 on Intel, 0x8000001D on AMD), then
//! [`CacheSizes::DEFAULT`]. Sizes are per instance: L1d and L2 per core, L3 per cache (shared by
//! the cores of a CCX or socket).

use std::sync::OnceLock;

/// Where a [`CacheSizes`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheSource {
    /// Linux sysfs.
    Sysfs,
    /// The CPUID instruction.
    Cpuid,
    /// Neither answered: [`CacheSizes::DEFAULT`].
    Default,
}

/// Data cache sizes in bytes, per instance. Any value may be 0 (a level the CPU lacks, or one the
/// source did not report); the block-size derivations clamp to sane ranges whatever they get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheSizes {
    /// L1 data cache of one core.
    pub l1d: usize,
    /// L2 (unified) of one core.
    pub l2: usize,
    /// L3 (unified), one instance, shared by the cores attached to it; 0 if none.
    pub l3: usize,
    /// Where the values came from.
    pub source: CacheSource,
}

impl CacheSizes {
    /// Used when nothing can be read: AMD Zen 4 (32 KiB L1d, 1 MiB L2, 32 MiB L3), the smallest
    /// L1 and L2 of the machines this workspace targets, so blocks sized for it fit the others.
    pub const DEFAULT: CacheSizes =
        CacheSizes { l1d: 32 << 10, l2: 1 << 20, l3: 32 << 20, source: CacheSource::Default };

    /// Sizes from explicit values (e.g. to derive block sizes for another machine).
    pub const fn new(l1d: usize, l2: usize, l3: usize) -> Self {
        CacheSizes { l1d, l2, l3, source: CacheSource::Default }
    }

    /// Reads a sysfs cache directory laid out as Linux's `.../cpu0/cache` (`index*/level`,
    /// `index*/type`, `index*/size`); `None` unless it names an L1 data cache and an L2.
    pub fn from_sysfs(dir: &std::path::Path) -> Option<Self> {
        let (mut l1d, mut l2, mut l3) = (0, 0, 0);
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            if !entry.file_name().to_string_lossy().starts_with("index") {
                continue;
            }
            let read = |f: &str| std::fs::read_to_string(entry.path().join(f)).ok();
            let (Some(level), Some(kind), Some(size)) = (read("level"), read("type"), read("size"))
            else {
                continue;
            };
            let Some(size) = parse_size(&size) else { continue };
            match (level.trim(), kind.trim()) {
                ("1", "Data" | "Unified") => l1d = size,
                ("2", "Data" | "Unified") => l2 = size,
                ("3", "Data" | "Unified") => l3 = size,
                _ => {}
            }
        }
        (l1d > 0 && l2 > 0).then_some(CacheSizes { l1d, l2, l3, source: CacheSource::Sysfs })
    }

    /// Reads CPUID's deterministic cache parameters (leaf 4 on Intel, 0x8000001D on AMD with
    /// topology extensions); `None` unless they describe an L1 data cache and an L2.
    pub fn from_cpuid() -> Option<Self> {
        cpuid_caches()
    }
}

impl std::fmt::Display for CacheSizes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let source = match self.source {
            CacheSource::Sysfs => "sysfs",
            CacheSource::Cpuid => "CPUID",
            CacheSource::Default => "default",
        };
        write!(
            f,
            "L1d {}, L2 {}, L3 {} ({source})",
            human(self.l1d),
            human(self.l2),
            human(self.l3)
        )
    }
}

/// `32768` → `32 KiB`, `1310720` → `1280 KiB`, `1048576` → `1 MiB`.
fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else if bytes.is_multiple_of(1 << 10) {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// The cache sizes of this machine (sysfs, else CPUID, else [`CacheSizes::DEFAULT`]), detected on
/// first use and cached.
pub fn detected() -> CacheSizes {
    static CACHES: OnceLock<CacheSizes> = OnceLock::new();
    *CACHES.get_or_init(|| {
        CacheSizes::from_sysfs(std::path::Path::new("/sys/devices/system/cpu/cpu0/cache"))
            .or_else(CacheSizes::from_cpuid)
            .unwrap_or(CacheSizes::DEFAULT)
    })
}

/// Parses a sysfs size: `32K`, `1024K`, `32M`, or plain bytes; `None` if malformed or overflowing.
fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, shift) = match s.as_bytes().last()? {
        b'K' | b'k' => (&s[..s.len() - 1], 10),
        b'M' | b'm' => (&s[..s.len() - 1], 20),
        b'G' | b'g' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    digits.trim().parse::<usize>().ok()?.checked_mul(1 << shift)
}

#[cfg(target_arch = "x86_64")]
fn cpuid_caches() -> Option<CacheSizes> {
    use std::arch::x86_64::{__cpuid_count, CpuidResult};
    // CPUID is available on every x86-64 CPU; the leaves below are read only after checking the
    // highest supported leaf, as the architecture requires.
    #[allow(unused_unsafe)]
    let cpuid = |leaf: u32, sub: u32| -> CpuidResult { unsafe { __cpuid_count(leaf, sub) } };
    let vendor = cpuid(0, 0);
    let amd = (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6E65, 0x444D_4163);
    let leaf = if amd {
        let ext_max = cpuid(0x8000_0000, 0).eax;
        // Topology extensions (CPUID 0x80000001 ECX bit 22) enable leaf 0x8000001D.
        let topoext = ext_max >= 0x8000_0001 && cpuid(0x8000_0001, 0).ecx & (1 << 22) != 0;
        if ext_max < 0x8000_001D || !topoext {
            return None;
        }
        0x8000_001D
    } else {
        if vendor.eax < 4 {
            return None;
        }
        4
    };
    let (mut l1d, mut l2, mut l3) = (0, 0, 0);
    // Subleaves enumerate the caches until one reports type 0; 16 bounds a broken CPUID.
    for sub in 0..16 {
        let r = cpuid(leaf, sub);
        let kind = r.eax & 0x1F;
        if kind == 0 {
            break;
        }
        let level = (r.eax >> 5) & 0x7;
        let ways = (r.ebx >> 22) as usize + 1;
        let partitions = ((r.ebx >> 12) & 0x3FF) as usize + 1;
        let line = (r.ebx & 0xFFF) as usize + 1;
        let sets = r.ecx as usize + 1;
        let size = ways.saturating_mul(partitions).saturating_mul(line).saturating_mul(sets);
        // Type 1 = data, 3 = unified (2 = instruction).
        match (level, kind) {
            (1, 1 | 3) => l1d = size,
            (2, 1 | 3) => l2 = size,
            (3, 1 | 3) => l3 = size,
            _ => {}
        }
    }
    (l1d > 0 && l2 > 0).then_some(CacheSizes { l1d, l2, l3, source: CacheSource::Cpuid })
}

#[cfg(not(target_arch = "x86_64"))]
fn cpuid_caches() -> Option<CacheSizes> {
    None
}

/// Cache configurations every block-size derivation is tested on: the machine kinds the
/// project meets, small, zero, odd and absurd sizes, and this machine's.
#[cfg(test)]
pub(crate) fn examples() -> [(&'static str, CacheSizes); 9] {
    [
        ("Zen 4", CacheSizes::new(32 << 10, 1 << 20, 32 << 20)),
        ("Zen 5", CacheSizes::new(48 << 10, 1 << 20, 32 << 20)),
        ("Ice Lake", CacheSizes::new(48 << 10, 1280 << 10, 48 << 20)),
        ("small", CacheSizes::new(16 << 10, 256 << 10, 0)),
        ("zero", CacheSizes::new(0, 0, 0)),
        ("odd", CacheSizes::new(12345, 67891, 1_000_003)),
        ("absurd", CacheSizes::new(usize::MAX, usize::MAX, usize::MAX)),
        ("default", CacheSizes::DEFAULT),
        ("detected", detected()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("32K\n"), Some(32 << 10));
        assert_eq!(parse_size("1280K"), Some(1280 << 10));
        assert_eq!(parse_size("32M"), Some(32 << 20));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("12Q"), None);
        assert_eq!(parse_size("99999999999999999999999G"), None);
    }

    #[test]
    fn sysfs_layout_is_read() {
        let dir = std::env::temp_dir().join(format!("attn-cache-test-{}", std::process::id()));
        let entries = [
            ("index0", "1", "Data", "48K"),
            ("index1", "1", "Instruction", "32K"),
            ("index2", "2", "Unified", "1280K"),
            ("index3", "3", "Unified", "49152K"),
        ];
        for (name, level, kind, size) in entries {
            let d = dir.join(name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("level"), format!("{level}\n")).unwrap();
            std::fs::write(d.join("type"), format!("{kind}\n")).unwrap();
            std::fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        let got = CacheSizes::from_sysfs(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        let want = CacheSizes { l1d: 48 << 10, l2: 1280 << 10, l3: 48 << 20, ..got.unwrap() };
        assert_eq!(got, Some(want));
        assert_eq!(want.source, CacheSource::Sysfs);
        assert_eq!(format!("{want}"), "L1d 48 KiB, L2 1280 KiB, L3 48 MiB (sysfs)");
        assert_eq!(CacheSizes::from_sysfs(&dir), None, "a missing directory is not an answer");
    }

    #[test]
    fn detection_gives_plausible_sizes() {
        let c = detected();
        assert_eq!(c, detected(), "cached");
        eprintln!("caches: {c}");
        assert!(c.l1d >= 4 << 10 && c.l2 >= c.l1d, "{c:?}");
        // Shown, not compared: a hypervisor may report CPUID and sysfs differently.
        eprintln!("CPUID: {:?}", CacheSizes::from_cpuid());
    }
}
