//! b_eff's message lengths: 1 B to 4 KiB doubling, then geometric steps up to
//! `Lmax = memory per process / 128` (b_eff 3.6: `MSGLENGTHS`, `MAX_FACT_2`).

/// How many message lengths b_eff measures.
pub const MESSAGE_LENGTHS: usize = 21;

/// The lengths `2^0 ..= 2^MAX_FACT_2` double; the rest grow by a constant factor.
pub const MAX_FACT_2: usize = 12;

/// From this much memory per process on, `Lmax` stays at 128 MiB (b_eff keeps message sizes,
/// displacements and the buffer length within a C `int`).
const LMAX_CAP_FROM_MB: u64 = 128 * 128;

/// The largest message: `memory_mb` MiB / 128, or 128 MiB from 16 GiB per process on.
pub fn lmax(memory_mb: u64) -> usize {
    if memory_mb >= LMAX_CAP_FROM_MB {
        128 << 20
    } else {
        (memory_mb as usize) * ((1 << 20) / 128)
    }
}

/// The message lengths and the factor between consecutive lengths above 4 KiB.
///
/// As b_eff computes them: the geometric part multiplies a running `f64` by the factor
/// `(Lmax / 4096)^(1/8)` and rounds each step to the nearest integer, so the last length is
/// `Lmax` up to rounding.
pub fn message_lengths(lmax: usize) -> ([usize; MESSAGE_LENGTHS], f64) {
    let mut lengths = [0usize; MESSAGE_LENGTHS];
    for (i, l) in lengths.iter_mut().enumerate().take(MAX_FACT_2 + 1) {
        *l = 1 << i;
    }
    let mut length = lengths[MAX_FACT_2] as f64;
    let factor = (lmax as f64 / length).powf(1.0 / (MESSAGE_LENGTHS - 1 - MAX_FACT_2) as f64);
    for l in lengths.iter_mut().skip(MAX_FACT_2 + 1) {
        length *= factor;
        *l = (length + 0.5) as usize;
    }
    (lengths, factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lmax_is_memory_over_128_capped_at_128_mib() {
        assert_eq!(lmax(128), 1 << 20);
        assert_eq!(lmax(8), 64 << 10);
        assert_eq!(lmax(1), 8192);
        assert_eq!(lmax(16383), 16383 * 8192);
        assert_eq!(lmax(16384), 128 << 20);
        assert_eq!(lmax(1 << 20), 128 << 20);
    }

    #[test]
    fn lengths_with_128_mb_match_the_reference_run() {
        // The `msglng=` line of shared/reference/beff-mpich-2ranks-short-test.sum.
        let (l, factor) = message_lengths(lmax(128));
        let expected = [
            1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536,
            131072, 262144, 524288, 1048576,
        ];
        assert_eq!(l, expected);
        assert_eq!(factor, 2.0);
    }

    #[test]
    fn geometric_steps_round_a_running_product() {
        // Lmax = 8 MB / 128 = 65536: factor 16^(1/8) = sqrt(2); by hand,
        // 4096·2^(k/2) for k = 1..8, rounded: 5793, 8192, 11585, 16384, 23170, 32768,
        // 46341, 65536.
        let (l, factor) = message_lengths(lmax(8));
        assert!((factor - 2f64.sqrt()).abs() < 1e-15);
        assert_eq!(
            &l[12..],
            &[4096, 5793, 8192, 11585, 16384, 23170, 32768, 46341, 65536]
        );
        // 1 MB: Lmax = 8192, factor 2^(1/8).
        let (l, _) = message_lengths(lmax(1));
        assert_eq!(
            &l[12..],
            &[4096, 4467, 4871, 5312, 5793, 6317, 6889, 7512, 8192]
        );
    }
}
