-- Example private_kde queries over the demo table `mixture` (column x).
-- Run them with:  dpcurve sql --table mixture=dpcurve-demo/mixture.parquet -f sql/kde_examples.sql
-- (tests/cli.rs runs this file, so it stays correct).

-- One row holding the whole curve.
SELECT private_kde(x, bandwidth => 0.02, epsilon => 0.5, delta => 1e-6,
                   lo => -0.2, hi => 1.2, points => 512) AS kde
FROM mixture;

-- The curve as (x, density) rows.
SELECT unnest(kde.x) AS x, unnest(kde.density) AS density
FROM (SELECT private_kde(x, 0.02, 0.5, 1e-6, lo => -0.2, hi => 1.2, points => 64) AS kde FROM mixture);

-- A filtered subset, the classic calibration, and only the free mass estimate.
SELECT private_kde(x, 0.05, 0.5, 1e-6, 0, 1, calibration => 'classic')['mass'] AS n_estimate
FROM mixture
WHERE x > 0.5;
