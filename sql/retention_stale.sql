-- Rollouts more than {lag} policy versions behind the newest one: what a max_policy_lag bound drops.
SELECT key FROM meta WHERE policy_version < (SELECT max(policy_version) FROM meta) - {lag}
