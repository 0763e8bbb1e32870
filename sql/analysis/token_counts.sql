-- Token counts per run: prompts, responses, and the response length distribution.
SELECT run_id, count(*) AS rollouts,
       sum(len(prompt_ids))::BIGINT AS prompt_tokens, sum(len(response_ids))::BIGINT AS response_tokens,
       avg(len(response_ids)) AS mean_response_len, max(len(response_ids)) AS max_response_len
FROM rollouts
GROUP BY run_id
ORDER BY run_id;
