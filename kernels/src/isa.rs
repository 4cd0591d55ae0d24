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

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}
