//! Go-compatible hashing: k8s `hashutil.DeepHashObject` over JSON bytes, kubelet container hashes and
//! kruise's env-from-metadata hash.
//!
//! Every hash kruise and kubelet compute here has the same shape: marshal a value with Go's
//! `encoding/json` ([`crate::gojson`]), then feed the resulting `[]byte` to `DeepHashObject`, which prints it
//! with `spew` (`%#v`) into an FNV-1a 32-bit hasher ([`deep_hash_bytes`]).

pub mod env;
pub mod kubelet;

/// FNV-1a 32-bit offset basis.
const FNV32_OFFSET: u32 = 0x811c_9dc5;
/// FNV-1a 32-bit prime.
const FNV32_PRIME: u32 = 0x0100_0193;

/// Incremental FNV-1a 32-bit hasher (Go's `hash/fnv.New32a`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fnv32a(u32);

impl Default for Fnv32a {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv32a {
    /// A hasher in its initial state (offset basis).
    pub const fn new() -> Self {
        Self(FNV32_OFFSET)
    }

    /// Feeds `bytes` into the hash.
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u32::from(b);
            self.0 = self.0.wrapping_mul(FNV32_PRIME);
        }
    }

    /// The current 32-bit digest (Go's `Sum32`).
    pub const fn sum32(&self) -> u32 {
        self.0
    }
}

/// `DeepHashObject(fnv.New32a(), bytes)` as k8s computes it for a `[]byte` argument, widened to `u64`
/// like `uint64(hash.Sum32())`.
///
/// spew's `%#v` rendering of a `[]byte` is `([]uint8)[b0 b1 b2 …]` (decimal bytes separated by single
/// spaces); that text is hashed with FNV-1a 32 here without ever being materialised.
pub fn deep_hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = Fnv32a::new();
    h.write(b"([]uint8)[");
    for (i, &b) in bytes.iter().enumerate() {
        if i > 0 {
            h.write(b" ");
        }
        h.write(decimal_u8(b).as_slice());
    }
    h.write(b"]");
    u64::from(h.sum32())
}

/// Decimal digits of a byte, without allocating.
fn decimal_u8(b: u8) -> DecimalU8 {
    let mut buf = [0u8; 3];
    let len = if b >= 100 {
        buf = [b'0' + b / 100, b'0' + (b / 10) % 10, b'0' + b % 10];
        3
    } else if b >= 10 {
        buf[0] = b'0' + b / 10;
        buf[1] = b'0' + b % 10;
        2
    } else {
        buf[0] = b'0' + b;
        1
    };
    DecimalU8 { buf, len }
}

/// Up to three ASCII digits.
struct DecimalU8 {
    buf: [u8; 3],
    len: usize,
}

impl DecimalU8 {
    fn as_slice(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obvious (allocating) rendering, as a reference for the streaming one.
    fn spew_text(bytes: &[u8]) -> String {
        let parts: Vec<String> = bytes.iter().map(|b| b.to_string()).collect();
        format!("([]uint8)[{}]", parts.join(" "))
    }

    fn fnv_of(text: &[u8]) -> u64 {
        let mut h = Fnv32a::new();
        h.write(text);
        u64::from(h.sum32())
    }

    #[test]
    fn fnv1a_matches_published_test_vectors() {
        // From the FNV reference test suite (and Go's hash/fnv tests).
        assert_eq!(fnv_of(b""), 0x811c_9dc5);
        assert_eq!(fnv_of(b"a"), 0xe40c_292c);
        assert_eq!(fnv_of(b"b"), 0xe70c_2de5);
        assert_eq!(fnv_of(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn null_json_hashes_to_the_documented_empty_env_value() {
        assert_eq!(deep_hash_bytes(b"null"), 86_995_377);
        assert_eq!(fnv_of(spew_text(b"null").as_bytes()), 86_995_377);
    }

    #[test]
    fn empty_byte_slice_is_rendered_as_empty_brackets() {
        assert_eq!(deep_hash_bytes(b""), fnv_of(b"([]uint8)[]"));
    }

    #[test]
    fn decimal_rendering_covers_one_two_and_three_digit_bytes() {
        for b in 0..=255u8 {
            assert_eq!(decimal_u8(b).as_slice(), b.to_string().as_bytes());
        }
    }

    proptest! {
        #[test]
        fn streaming_hash_equals_hash_of_materialised_spew_text(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(deep_hash_bytes(&bytes), fnv_of(spew_text(&bytes).as_bytes()));
        }
    }
}
