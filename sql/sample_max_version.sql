-- The buffer's newest policy version (freshness / success_blend when the caller gives none).
SELECT max(policy_version) AS v FROM meta
