-- The group of each wanted key and the group's seeded hash ({gh}, as the group sampler orders
-- groups): the coordinator merges the shards' first groups by it (lakebuffer.distributed.draw).
SELECT key, {by} AS g, {gh} AS gh FROM meta WHERE key IN (SELECT key FROM wanted)
