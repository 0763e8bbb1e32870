-- Truncation rate per run and policy version. The schema has no `truncated` flag, so a response as
-- long as the longest one of its run is taken as cut at the generation cap (max_response_len).
WITH cap AS (SELECT run_id, max(len(response_ids)) AS max_response_len FROM rollouts GROUP BY run_id)
SELECT r.run_id, r.policy_version, count(*) AS rollouts,
       count(*) FILTER (WHERE len(r.response_ids) >= cap.max_response_len) AS truncated,
       avg((len(r.response_ids) >= cap.max_response_len)::INTEGER) AS truncation_rate,
       any_value(cap.max_response_len) AS max_response_len
FROM rollouts r JOIN cap USING (run_id)
GROUP BY ALL
ORDER BY r.run_id, r.policy_version;
