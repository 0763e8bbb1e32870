DELETE FROM meta WHERE key IN (SELECT key FROM meta_gone)
