//! What the hot loops share: the instruction sets they are compiled for (one copy per set,
//! chosen at run time with `is_x86_feature_detected!`; every copy computes the same bits) and a
//! float-to-integer conversion that needs neither libm nor saturating casts.

/// `x + ROUND_MAGIC` (1.5·2^52) rounds x to the nearest integer, which is then the low
/// [`LOW_BITS`] of the sum's representation (valid for |x| < 2^51). Converting this way
/// avoids both libm's floor/round (no SSE4.1 on the baseline target) and the saturating
/// float-to-int casts, which dominated the binning loop.
pub(crate) const ROUND_MAGIC: f64 = 6_755_399_441_055_744.0;
pub(crate) const LOW_BITS: u64 = (1 << 51) - 1;

/// The instruction sets a hot loop is compiled for, chosen at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kernel {
    /// The widest kernel this CPU runs (detected once by the standard library).
    pub(crate) fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512dq") {
                return Kernel::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Kernel::Avx2;
            }
        }
        Kernel::Portable
    }

    /// Every kernel this CPU runs (tests compare them bit for bit).
    #[cfg(test)]
    pub(crate) fn available() -> Vec<Kernel> {
        let mut all = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                all.push(Kernel::Avx2);
            }
            if Kernel::detect() == Kernel::Avx512 {
                all.push(Kernel::Avx512);
            }
        }
        all
    }
}
