-- The priorities `update_priority` set on a shard (key, priority): the coordinator's union catalog
-- serves them to samplers that run over the union of the shards' metadata (lakebuffer.distributed.draw).
SELECT key, priority FROM priorities
