//! The covariance eigenbasis of the mean curve (SPEC §3): Mirshani et al.'s kernels C1–C4 on
//! the grid `k/(m−1)`, the kept eigenpairs of `a ↦ (1/m)·C·a`, and a proven bound on the
//! stored basis's operator norm. Public, data-independent, cached.

use std::sync::Arc;

use nalgebra::{DMatrix, SymmetricEigen};

use crate::mechanism::noise::cache::{PublicCache, decode_f64s, encode_f64s, stored};

/// Relative cut-off of kept eigenvalues (SPEC §3).
pub const EIGEN_CUTOFF: f64 = 1e-12;
/// Mirshani et al.'s covariance kernels (supplement, eq. 6), all with range ρ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CovKernel {
    /// C1: `exp(−|s−t|²/ρ)` (note ρ, not 2ρ²).
    Gaussian,
    /// C2: Matérn ν = 5/2.
    Matern52,
    /// C3: Matérn ν = 3/2.
    Matern32,
    /// C4: `exp(−|s−t|/ρ)`.
    Exponential,
}

impl CovKernel {
    /// Parses the SQL spelling.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "gaussian" => Some(CovKernel::Gaussian),
            "matern52" => Some(CovKernel::Matern52),
            "matern32" => Some(CovKernel::Matern32),
            "exponential" => Some(CovKernel::Exponential),
            _ => None,
        }
    }

    /// The SQL spelling.
    pub fn name(self) -> &'static str {
        match self {
            CovKernel::Gaussian => "gaussian",
            CovKernel::Matern52 => "matern52",
            CovKernel::Matern32 => "matern32",
            CovKernel::Exponential => "exponential",
        }
    }

    /// `c(s, t)` as a function of `d = |s − t|`.
    pub fn eval(self, d: f64, rho: f64) -> f64 {
        let d = d.abs();
        match self {
            CovKernel::Gaussian => (-d * d / rho).exp(),
            CovKernel::Matern52 => {
                let a = 5f64.sqrt() * d / rho;
                (1.0 + a + 5.0 * d * d / (3.0 * rho * rho)) * (-a).exp()
            }
            CovKernel::Matern32 => {
                let a = 3f64.sqrt() * d / rho;
                (1.0 + a) * (-a).exp()
            }
            CovKernel::Exponential => (-d / rho).exp(),
        }
    }
}

/// The kept eigenpairs of `a ↦ (1/m)·C·a` on the grid `k/(m−1)`.
#[derive(Debug, Clone)]
pub struct Eigenbasis {
    m: usize,
    /// Kept eigenvalues, descending.
    pub lambda: Vec<f64>,
    /// `v_j` (length m each), orthonormal in the discrete L² inner product.
    pub vectors: Vec<Vec<f64>>,
    /// Upper bound on the operator norm of `[v_1 … v_J]/√m` as stored (1 up to round-off):
    /// `sqrt(1 + ‖VᵀV/m − I‖_F + rounding of that computation)`. Sensitivities use it, so
    /// the privacy claim is about the vectors actually used, not ideal ones.
    pub norm_bound: f64,
}

type CacheKey = (CovKernel, u64, usize);
static CACHE: PublicCache<CacheKey, Eigenbasis> = PublicCache::new(256 << 20);
/// The version of [`Eigenbasis::compute`]'s definition in stored keys: bump it when the
/// computation (kernels, cut-off, bound) changes, so bases stored by the old one are not used.
const DEFINITION: u32 = 1;

impl Eigenbasis {
    /// Computes the eigenpairs (O(m³); see [`Eigenbasis::cached`]).
    pub fn compute(kernel: CovKernel, rho: f64, m: usize) -> Self {
        let t = |k: usize| if m == 1 { 0.0 } else { k as f64 / (m - 1) as f64 };
        let c = DMatrix::from_fn(m, m, |k, l| kernel.eval(t(k) - t(l), rho) / m as f64);
        let eig = SymmetricEigen::new(c);
        let mut order: Vec<usize> = (0..m).collect();
        order.sort_by(|&a, &b| eig.eigenvalues[b].total_cmp(&eig.eigenvalues[a]));
        let top = eig.eigenvalues[order[0]];
        let scale = (m as f64).sqrt();
        let mut lambda = Vec::new();
        let mut vectors = Vec::new();
        for j in order {
            let l = eig.eigenvalues[j];
            if !(l > EIGEN_CUTOFF * top) {
                break;
            }
            lambda.push(l);
            vectors.push(eig.eigenvectors.column(j).iter().map(|u| u * scale).collect());
        }
        let norm_bound = Self::operator_norm_bound(m, &vectors);
        Eigenbasis { m, lambda, vectors, norm_bound }
    }

    fn operator_norm_bound(m: usize, vectors: &[Vec<f64>]) -> f64 {
        let j = vectors.len();
        let v = DMatrix::from_fn(m, j, |k, c| vectors[c][k]);
        let gram = v.transpose() * &v / m as f64;
        let off = (gram - DMatrix::<f64>::identity(j, j)).norm();
        // Each Gram entry is a sum of m products of entries ≤ √m in size, divided by m:
        // its f64 error is ≤ (m + 2)·u·(Σ|v_i v_j|/m) ≤ (m + 2)·u·‖v_i‖‖v_j‖/m·m ≈ (m + 2)·u.
        let rounding = j as f64 * (m as f64 + 2.0) * f64::EPSILON;
        (1.0 + off + rounding).sqrt()
    }

    /// The eigenpairs for (kernel, ρ, m), computed once per process and reused; across processes,
    /// kept in the public store a catalog session installs (an m = 1000 basis takes ≈ 1 s).
    pub fn cached(kernel: CovKernel, rho: f64, m: usize) -> Arc<Self> {
        let key = (kernel, rho.to_bits(), m);
        let bytes = |b: &Eigenbasis| 8 * (b.lambda.len() + b.vectors.iter().map(Vec::len).sum::<usize>());
        CACHE
            .get_or_try_insert(key, bytes, || {
                Ok::<_, std::convert::Infallible>(stored(
                    "eigenbasis",
                    DEFINITION,
                    &key,
                    |b: &Eigenbasis| Some(b.encode()),
                    |bytes| Self::decode(bytes, m),
                    || Self::compute(kernel, rho, m),
                ))
            })
            .unwrap_or_else(|e| match e {})
    }

    /// The stored form: m, J, the norm bound, λ, then the vectors, as little-endian f64s.
    fn encode(&self) -> Vec<u8> {
        let head = [self.m as f64, self.lambda.len() as f64, self.norm_bound];
        encode_f64s(head.into_iter().chain(self.lambda.iter().copied()).chain(self.vectors.iter().flatten().copied()))
    }

    /// A stored basis of curve length m, if it has the shape [`Self::compute`] gives (lengths, λ
    /// positive, descending and above the cut-off, every value finite, a norm bound ≥ 1).
    fn decode(bytes: &[u8], m: usize) -> Option<Self> {
        let values = decode_f64s(bytes)?;
        let (&[len, j, norm_bound], rest) = values.split_first_chunk::<3>()?;
        let j = j as usize;
        let shaped = len == m as f64 && j >= 1 && j as f64 == values[1] && j <= m && rest.len() == j + j * m;
        if !shaped || !values.iter().all(|v| v.is_finite()) || !(norm_bound >= 1.0) {
            return None;
        }
        let (lambda, vectors) = rest.split_at(j);
        let ordered =
            lambda[0] > 0.0 && lambda.windows(2).all(|w| w[0] >= w[1]) && lambda[j - 1] > EIGEN_CUTOFF * lambda[0];
        ordered.then(|| Eigenbasis {
            m,
            lambda: lambda.to_vec(),
            vectors: vectors.chunks_exact(m).map(<[f64]>::to_vec).collect(),
            norm_bound,
        })
    }

    /// Benchmarks only: forget every cached eigenbasis (to time uncached queries).
    #[doc(hidden)]
    pub fn clear_cache() {
        CACHE.clear();
    }

    /// Curve length m.
    pub fn len(&self) -> usize {
        self.m
    }

    /// Whether no eigenpair was kept (never for m ≥ 1).
    pub fn is_empty(&self) -> bool {
        self.lambda.is_empty()
    }

    /// `⟨x, v_j⟩` for every kept j.
    pub fn coefficients(&self, x: &[f64]) -> Vec<f64> {
        self.vectors.iter().map(|v| inner(x, v)).collect()
    }

    /// `Σ_j c_j v_j`.
    pub fn synthesize(&self, coeffs: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; self.m];
        for (c, v) in coeffs.iter().zip(&self.vectors) {
            for (o, vk) in out.iter_mut().zip(v) {
                *o += c * vk;
            }
        }
        out
    }
}

/// Discrete L² inner product `(1/m)·Σ a_k b_k`.
pub fn inner(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() / a.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_basis_decodes_bit_identical_and_only_in_the_shape_compute_gives() {
        for kernel in [CovKernel::Gaussian, CovKernel::Exponential] {
            let b = Eigenbasis::compute(kernel, 0.2, 40);
            let bytes = b.encode();
            let d = Eigenbasis::decode(&bytes, 40).expect("decodes");
            assert_eq!(d.lambda, b.lambda);
            assert_eq!(d.vectors, b.vectors);
            assert_eq!((d.m, d.norm_bound.to_bits()), (b.m, b.norm_bound.to_bits()));
            // Another m, a truncated or extended file: refused.
            assert!(Eigenbasis::decode(&bytes, 41).is_none());
            assert!(Eigenbasis::decode(&bytes[..bytes.len() - 8], 40).is_none());
            assert!(Eigenbasis::decode(&[&bytes[..], &[0; 8]].concat(), 40).is_none());
            assert!(Eigenbasis::decode(&bytes[..bytes.len() - 1], 40).is_none());
            // Values compute never gives: refused.
            let edit = |at: usize, v: f64| {
                let mut f = decode_f64s(&bytes).unwrap();
                f[at] = v;
                Eigenbasis::decode(&encode_f64s(f), 40)
            };
            let j = b.lambda.len();
            assert!(edit(2, 0.5).is_none(), "a norm bound below 1");
            assert!(edit(2, f64::INFINITY).is_none());
            assert!(edit(1, j as f64 + 0.5).is_none(), "a fractional count");
            assert!(edit(3, -1.0).is_none(), "a negative λ");
            assert!(edit(3 + j - 1, 2.0 * b.lambda[0]).is_none(), "λ not descending");
            assert!(edit(3 + j + 5, f64::NAN).is_none(), "a NaN in a vector");
            assert!(edit(3 + j + 5, 0.25).is_some(), "the control: a finite change of shape passes");
        }
    }
}
