-- Metadata of every live rollout (no payload columns): what samplers select keys on.
-- `_batch` is the internal batch id, used to map keys to tiers without touching payload;
-- `_key_hash` is hash(key), precomputed once so seeded sampling hashes are cheap at 10M rows.
CREATE OR REPLACE TABLE meta AS SELECT *, 0::UBIGINT AS _key_hash FROM meta_seed LIMIT 0;
