//! Finding an id in a sorted array of ids (an index table's objects or
//! links): where the first entry not below a key is.
//!
//! Ids are BLAKE3 hashes, so within a table they are spread evenly: the
//! key's own value says about where it sits. The search starts there
//! (interpolation on the 8 bytes after the ones every entry of the range
//! shares), widens by doubling until the key is bracketed, then halves.
//! Expected probes are a few, all near each other in the file; a plain
//! halving search touched ~17 places across a 100k-entry table, and the
//! index lookups it made were a quarter of `mass report`'s time at 1M
//! events. Entries that are not spread evenly (nothing in the format
//! promises it) cost at most about twice the halving search, never a
//! wrong answer: the bracket is checked, not assumed.

use std::cmp::Ordering;

/// Ranges shorter than this are halved directly.
const SMALL: usize = 16;

/// First position `p` in `[lo, hi)` with `at(p)[..key.len()] >= key`, or
/// `hi`; the entries of `[lo, hi)` must be sorted and at least
/// `key.len()` bytes long. `shared` leading bytes are the same in every
/// entry of the range (the fan-out byte of a bucket), so the guess reads
/// the 8 bytes after them.
pub(crate) fn lower_bound<'a>(
    key: &[u8],
    shared: usize,
    lo: usize,
    hi: usize,
    at: impl Fn(usize) -> &'a [u8],
) -> usize {
    let below = |p: usize| compare(&at(p)[..key.len()], key) == Ordering::Less;
    let Some(k) = key.get(shared..shared + 8) else {
        return halve(lo, hi, below);
    };
    if hi - lo < SMALL {
        return halve(lo, hi, below);
    }
    let k = u64::from_be_bytes(k.try_into().unwrap_or([0; 8]));
    let guess = lo + ((u128::from(k) * (hi - lo) as u128) >> 64) as usize;
    // The answer is in [a, b]: b is `hi` or a position not below the key.
    let (mut a, mut b) = (lo, hi);
    let mut step = 1;
    if below(guess) {
        a = guess + 1;
        while let Some(p) = guess.checked_add(step).filter(|&p| p < hi) {
            if !below(p) {
                b = p;
                break;
            }
            a = p + 1;
            step *= 2;
        }
    } else {
        b = guess;
        while let Some(p) = guess.checked_sub(step).filter(|&p| p >= lo) {
            if below(p) {
                a = p + 1;
                break;
            }
            b = p;
            step *= 2;
        }
    }
    halve(a, b, below)
}

/// The plain halving search: first position in `[lo, hi)` not below.
fn halve(mut lo: usize, mut hi: usize, below: impl Fn(usize) -> bool) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if below(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Byte-wise order, the first 8 bytes compared as one number (most
/// comparisons end there, without a call to `memcmp`).
pub(crate) fn compare(a: &[u8], b: &[u8]) -> Ordering {
    if let (Some(x), Some(y)) = (a.get(..8), b.get(..8)) {
        let x = u64::from_be_bytes(x.try_into().unwrap_or([0; 8]));
        let y = u64::from_be_bytes(y.try_into().unwrap_or([0; 8]));
        if x != y {
            return x.cmp(&y);
        }
    }
    a.cmp(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (no dependency for a test oracle).
    fn next(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    fn ids(n: usize, seed: u64, spread: impl Fn(u64) -> u64) -> Vec<[u8; 32]> {
        let mut s = seed | 1;
        let mut v: Vec<[u8; 32]> = (0..n)
            .map(|_| {
                let mut id = [0u8; 32];
                for c in id.chunks_mut(8) {
                    c.copy_from_slice(&spread(next(&mut s)).to_be_bytes());
                }
                id
            })
            .collect();
        v.sort();
        v
    }

    /// Every answer equals the halving search's (the oracle), for keys
    /// present, absent, below and above every entry, and prefixes, over
    /// evenly spread ids and over ids bunched in a corner of the range
    /// (where the guess is far off), many sizes and seeds.
    #[test]
    fn finds_what_halving_finds_on_any_spread() {
        type Spread = (&'static str, fn(u64) -> u64);
        let spreads: [Spread; 4] = [
            ("even", |x| x),
            ("bunched low", |x| x >> 40),
            ("bunched high", |x| u64::MAX - (x >> 48)),
            ("few values", |x| x % 3),
        ];
        for (name, spread) in spreads {
            for seed in 1..=40u64 {
                let n = (seed as usize * 37) % 700;
                let v = ids(n, seed, spread);
                let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut keys: Vec<Vec<u8>> = v.iter().map(|k| k.to_vec()).collect();
                keys.extend(ids(50, seed + 1000, spread).iter().map(|k| k.to_vec()));
                keys.push(vec![0; 32]);
                keys.push(vec![0xff; 32]);
                for k in v.iter().take(20) {
                    let len = 1 + (next(&mut s) % 31) as usize;
                    keys.push(k[..len].to_vec());
                }
                for key in &keys {
                    for shared in [0, 1] {
                        let (lo, hi) = (0, v.len());
                        let want = halve(lo, hi, |p| v[p][..key.len()] < key[..]);
                        let got = lower_bound(key, shared, lo, hi, |p| &v[p][..]);
                        assert_eq!(got, want, "{name}, seed {seed}, n {n}, key {key:02x?}");
                    }
                }
            }
        }
    }

    #[test]
    fn compare_is_byte_order() {
        let mut s = 7u64;
        for _ in 0..10_000 {
            let len = (next(&mut s) % 12) as usize;
            let a: Vec<u8> = (0..len).map(|_| (next(&mut s) % 3) as u8).collect();
            let b: Vec<u8> = (0..len).map(|_| (next(&mut s) % 3) as u8).collect();
            assert_eq!(compare(&a, &b), a.cmp(&b), "{a:?} {b:?}");
        }
    }
}
