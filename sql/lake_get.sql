-- Rows of the lake by key (the caller reorders them to the order asked).
SELECT {columns} FROM rollouts r WHERE r.key IN (SELECT key FROM wanted)
