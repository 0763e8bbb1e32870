-- The coordinator's union catalog: this draw's priorities (the shards' `priorities`, registered as
-- the Arrow table {source}) replace the last draw's.
DELETE FROM priorities;
INSERT INTO priorities SELECT key, priority FROM {source};
