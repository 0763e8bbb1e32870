-- Whole multi-agent teams aligned by step. A team is (episode_id, team_id); its agents are the
-- distinct agent_id of all its rows. A step of a team is complete when it has exactly one row per
-- agent of the team and all of them match {where}; teams with at least {min_steps} complete steps
-- are eligible, {n} of them are sampled by smallest seeded hash, and the rows of their complete
-- steps are returned ordered by (team rank, step, agent_id).
WITH r AS (
    SELECT key, episode_id AS e, team_id AS t, agent_id AS a, step, COALESCE({where}, FALSE) AS m
    FROM {source}
    WHERE episode_id IS NOT NULL AND step IS NOT NULL
      AND episode_id IN (SELECT episode_id FROM {source} WHERE {where} AND episode_id IS NOT NULL)
),
s AS (
    SELECT *,
           count(DISTINCT a) OVER (PARTITION BY e, t) AS agents,
           count(DISTINCT a) FILTER (WHERE m) OVER (PARTITION BY e, t, step) AS ok_agents,
           count(*) OVER (PARTITION BY e, t, step) AS step_rows
    FROM r
),
complete AS (
    SELECT key, e, t, a, step FROM s
    WHERE agents > 0 AND ok_agents = agents AND step_rows = agents
),
teams AS (
    SELECT e, t, {th} AS h
    FROM complete
    GROUP BY e, t
    HAVING count(DISTINCT step) >= {min_steps}
    ORDER BY h, e, t
    LIMIT {n}
),
ranked AS (
    SELECT e, t, row_number() OVER (ORDER BY h, e, t) AS team FROM teams
)
SELECT complete.key, ranked.team, complete.step, complete.a AS agent_id
FROM ranked
JOIN complete ON complete.e = ranked.e AND complete.t IS NOT DISTINCT FROM ranked.t
ORDER BY ranked.team, complete.step, complete.a
