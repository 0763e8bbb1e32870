-- Live rollouts in the catalog: the denominator of a predicate's remembered density.
SELECT count(*) AS n FROM meta
