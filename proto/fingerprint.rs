// The fingerprint of the CRI proto that src/cri/generated/runtime.v1.rs records in its second
// line: written by tools/cri-gen (scripts/gen-cri.sh) and checked by kruised's build.rs, both of
// which include this file (64-bit FNV-1a: no hashing crate needed in either).

/// 64-bit FNV-1a of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The line the generated file carries for the proto `bytes`.
pub fn fingerprint_line(bytes: &[u8]) -> String {
    format!("// proto fnv1a64: {:016x}", fnv1a64(bytes))
}
