-- Stream live rollouts of one consistent snapshot of the hot, warm and cold-only rows.
-- cold_keys: the keys of the cold batches (the lake files in cold_data also hold rows still local).
SELECT {columns} FROM (
    SELECT * FROM hot_data
    UNION ALL BY NAME SELECT * FROM warm_data
    UNION ALL BY NAME SELECT {cold_columns} FROM cold_data WHERE key IN (SELECT key FROM cold_keys)
)
WHERE {where}
