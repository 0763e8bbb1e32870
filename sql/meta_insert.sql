INSERT INTO meta SELECT *, hash(key) AS _key_hash FROM meta_new
