-- A shard's metadata rows (no payload), for the sharded coordinator's exact sampling: it samples
-- over the union of every shard's `meta` as one buffer would (lakebuffer.distributed.draw).
SELECT * EXCLUDE (_batch) FROM meta
