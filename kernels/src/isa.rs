//! The instruction sets a kernel can run on, detected once at run time.

use std::sync::OnceLock;

/// An instruction-set path of the kernels, narrowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain Rust: the reference every other path is tested against.
    Scalar,
    /// x86-64 AVX2 with FMA and F16C (8 float lanes).
    Avx2,
    /// x86-64 AVX-512F (16 float lanes).
    Avx512,
}

impl Isa {
    /// The widest path this CPU runs.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| *Isa::available().last().expect("scalar always runs"))
    }

    /// Every path this CPU runs, narrowest first (tests force each one).
    pub fn available() -> Vec<Isa> {
        let mut paths = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                paths.push(Isa::Avx2);
                if std::is_x86_feature_detected!("avx512f") {
                    paths.push(Isa::Avx512);
                }
            }
        }
        paths
    }

    /// `work` compiled for this path's vector width: its plain Rust loops vectorize as
    /// wide as the path allows (the same arithmetic in the same order, so the same bits:
    /// Rust never fuses a multiply and an add on its own).
    #[inline(always)]
    pub fn vectorized<V: Vectorized>(self, work: V) -> V::Output {
        match self {
            #[cfg(target_arch = "x86_64")]
            // Sound: `Isa::available` offers AVX-512 only where AVX-512F was detected.
            Isa::Avx512 => unsafe { on_avx512(work) },
            #[cfg(target_arch = "x86_64")]
            // Sound: and AVX2 only where AVX2 and FMA were.
            Isa::Avx2 => unsafe { on_avx2(work) },
            _ => work.run(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// Work [`Isa::vectorized`] compiles into each path.
pub trait Vectorized {
    type Output;
    /// The work. Implementations are `#[inline(always)]`, which inlines them into each
    /// path's entry below, compiled for its instruction set. (A closure cannot be marked
    /// so, and once too large to inline it is compiled once on its own, for the baseline
    /// x86-64's SSE2: the per-token kernels ran 4 floats wide, spilling registers.)
    fn run(self) -> Self::Output;
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn on_avx512<V: Vectorized>(work: V) -> V::Output {
    work.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn on_avx2<V: Vectorized>(work: V) -> V::Output {
    work.run()
}
