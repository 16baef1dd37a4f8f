//! A small deterministic mutational fuzzer on the stable toolchain, for the fuzz targets of
//! the crates' decoders (`pagewire-transport`'s and `pagewire-boot`'s `fuzz` modules).
//!
//! It starts from valid encodings (the seeds) and mutates them: bit flips, bytes and
//! 2/4/8-byte fields set to their extremes or at random, truncation, extension, splices;
//! one input in sixteen is random bytes. `PAGEWIRE_FUZZ_INPUTS` is the number of inputs per
//! target (default 100,000) and `PAGEWIRE_FUZZ_SEED` the generator's seed (default 1), so a
//! failure is reproducible.

use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Values a mutated field takes besides random ones.
const EXTREMES: [u64; 10] = [
    0,
    1,
    2,
    0x7f,
    0x80,
    0xff,
    0x3fc0,
    0x4000,
    u64::MAX - 4095,
    u64::MAX,
];

/// Runs `check` on `PAGEWIRE_FUZZ_INPUTS` inputs mutated from `seeds`, at most `max_len`
/// bytes each; `check` says whether the decoder accepted the input. Prints the counts and
/// the time taken.
pub fn drive(name: &str, seeds: &[Vec<u8>], max_len: usize, mut check: impl FnMut(&[u8]) -> bool) {
    let inputs: u64 = std::env::var("PAGEWIRE_FUZZ_INPUTS")
        .ok()
        .and_then(|v| v.replace('_', "").parse().ok())
        .unwrap_or(100_000);
    let seed: u64 = std::env::var("PAGEWIRE_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut input = Vec::with_capacity(max_len);
    let start = Instant::now();
    let mut accepted = 0u64;
    for _ in 0..inputs {
        input.clear();
        if rng.gen_ratio(1, 16) {
            let n = rng.gen_range(0..=max_len);
            input.extend((0..n).map(|_| rng.gen::<u8>()));
        } else {
            input.extend_from_slice(&seeds[rng.gen_range(0..seeds.len())]);
            for _ in 0..rng.gen_range(1..=4) {
                mutate(&mut rng, &mut input, seeds, max_len);
            }
        }
        accepted += check(&input) as u64;
    }
    eprintln!(
        "fuzz {name}: {inputs} inputs (seed {seed}), {accepted} accepted, in {:.2} s",
        start.elapsed().as_secs_f64()
    );
    assert!(accepted > 0, "the mutator never produced a valid input");
}

fn mutate(rng: &mut StdRng, b: &mut Vec<u8>, seeds: &[Vec<u8>], max_len: usize) {
    match rng.gen_range(0..7) {
        0 if !b.is_empty() => {
            let i = rng.gen_range(0..b.len());
            b[i] ^= 1 << rng.gen_range(0..8);
        }
        1 if !b.is_empty() => {
            let i = rng.gen_range(0..b.len());
            b[i] = rng.gen();
        }
        2..=4 => {
            // A field of 1, 2, 4 or 8 bytes, aligned to its size most of the time.
            let width = [1usize, 2, 4, 8][rng.gen_range(0..4)];
            if b.len() < width {
                return;
            }
            let mut at = rng.gen_range(0..=b.len() - width);
            if rng.gen_ratio(3, 4) {
                at -= at % width;
            }
            let v = if rng.gen() {
                EXTREMES[rng.gen_range(0..EXTREMES.len())]
            } else {
                rng.gen()
            };
            let v = if rng.gen_ratio(1, 4) {
                v.wrapping_neg()
            } else {
                v
            };
            b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
        }
        5 => {
            let n = rng.gen_range(0..=b.len());
            b.truncate(n);
        }
        _ => {
            if rng.gen() {
                let extra = rng.gen_range(1..=64).min(max_len.saturating_sub(b.len()));
                b.extend((0..extra).map(|_| rng.gen::<u8>()));
            } else {
                // Splice the tail of another seed.
                let other = &seeds[rng.gen_range(0..seeds.len())];
                let from = rng.gen_range(0..=other.len());
                let at = rng.gen_range(0..=b.len());
                b.truncate(at);
                b.extend_from_slice(&other[from..]);
                b.truncate(max_len);
            }
        }
    }
}
