DELETE FROM priorities WHERE key IN (SELECT key FROM {table})
