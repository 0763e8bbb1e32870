-- Metadata of every live rollout (no payload columns): what samplers select keys on.
-- `_batch` is the internal batch id, used to map keys to tiers without touching payload.
CREATE OR REPLACE TABLE meta AS SELECT * FROM meta_seed LIMIT 0;
