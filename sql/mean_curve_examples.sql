-- Example private_mean_curve queries over a table `curves` with a list column `c`
-- (the demo writes one: dpcurve-demo/curves.parquet, 100 points per curve).
-- Run them with:  dpcurve sql --table curves=dpcurve-demo/curves.parquet -f sql/mean_curve_examples.sql
-- (tests/cli.rs runs this file, so it stays correct).

-- Gaussian-process mechanism with the default kernel (matern32, ρ = 0.2, φ = 0.1).
SELECT private_mean_curve(c, epsilon => 1, delta => 1e-5, clip => 0.5) AS m FROM curves;

-- Pure ε-DP (ICLP, δ = 0), a smoother Gaussian kernel, and the curve as (t, mean) rows.
SELECT unnest(m.t) AS t, unnest(m.mean) AS mean
FROM (SELECT private_mean_curve(c, 1.0, 0, kernel => 'gaussian', range => 0.2, clip => 0.5) AS m FROM curves);

-- Only the noisy count (part of the release, so free once the release is paid for).
SELECT private_mean_curve(c, 0.5, 1e-6, clip => 0.5)['n'] AS n_estimate FROM curves;
