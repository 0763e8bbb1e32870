-- The complete steps of the candidate teams in `sample_teams`. A team's agents are the distinct
-- agent_id of all its rows (matching {where} or not); a step is complete when it has exactly one
-- row per agent and all of them match {where}. Returns those rows with their team's hash h.
WITH r AS (
    SELECT m.key, c.h, m.agent_id AS a, m.step, COALESCE({where}, FALSE) AS ok
    FROM {source} AS m
    JOIN sample_teams AS c ON m.episode_id = c.e AND m.team_id IS NOT DISTINCT FROM c.tm
    WHERE m.step IS NOT NULL AND m.episode_id IN (SELECT e FROM sample_teams)
),
s AS (
    SELECT *,
           count(DISTINCT a) OVER (PARTITION BY h) AS agents,
           count(DISTINCT a) FILTER (WHERE ok) OVER (PARTITION BY h, step) AS ok_agents,
           count(*) OVER (PARTITION BY h, step) AS step_rows
    FROM r
)
SELECT key, h, step, a AS agent_id
FROM s
WHERE agents > 0 AND ok_agents = agents AND step_rows = agents
