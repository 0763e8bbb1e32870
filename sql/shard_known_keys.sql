-- Which of the wanted keys this shard holds (a sharded get of keys a user gave at push, which
-- name no shard, asks every shard).
SELECT key FROM meta WHERE key IN (SELECT key FROM wanted)
