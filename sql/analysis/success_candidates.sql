-- Success-replay candidates: prompts solved (verified, or reward >= 0.9) in some run that another run
-- has seen but not solved: their verified responses could seed that run.
WITH solved AS (
    SELECT prompt_id, run_id, count(*) AS solutions, max(reward) AS best_reward
    FROM rollouts WHERE verified OR reward >= 0.9 GROUP BY ALL
), attempted AS (
    SELECT prompt_id, run_id, bool_or(verified OR reward >= 0.9) AS ok FROM rollouts GROUP BY ALL
)
SELECT s.prompt_id, s.run_id AS solved_in, a.run_id AS unsolved_in, s.solutions, s.best_reward
FROM solved s JOIN attempted a ON a.prompt_id = s.prompt_id AND a.run_id <> s.run_id AND NOT a.ok
ORDER BY s.best_reward DESC, s.prompt_id
LIMIT 200;
