//! Seeds derived from a run's recorded root seed, so randomness needs no effect:
//! `derive(root, stream, purpose)` is a pure function (BLAKE3 key derivation).

/// A 64-bit seed for `purpose` within `stream` of a run whose root seed is `root`.
pub fn derive(root: u64, stream: &str, purpose: &str) -> u64 {
    let mut h = blake3::Hasher::new_derive_key("mass replay seed v1");
    h.update(&root.to_le_bytes());
    h.update(&(stream.len() as u64).to_le_bytes());
    h.update(stream.as_bytes());
    h.update(purpose.as_bytes());
    let out = h.finalize();
    let mut b = [0u8; 8];
    b.copy_from_slice(&out.as_bytes()[..8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn pinned_and_separated() {
        assert_eq!(
            super::derive(42, "main", "pairing"),
            super::derive(42, "main", "pairing")
        );
        assert_ne!(
            super::derive(42, "main", "pairing"),
            super::derive(43, "main", "pairing")
        );
        assert_ne!(
            super::derive(42, "ma", "inpairing"),
            super::derive(42, "main", "pairing")
        );
    }
}
