-- The columns of the metadata table (samplers use `_key_hash` when the catalog keeps one).
SELECT * FROM meta LIMIT 0
