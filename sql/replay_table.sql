-- Replay events (engine/replays.py): one row per rollout drawn by sample(), with the policy version
-- and step that replayed it (ReplayBuffer.set_policy_version) and when. Policy lag at replay is
-- replay_version - the rollout's policy_version (sql/analysis/policy_lag_at_replay.sql).
CREATE OR REPLACE TABLE replays (key VARCHAR, replay_version BIGINT, replay_step BIGINT, replayed_at TIMESTAMPTZ);
