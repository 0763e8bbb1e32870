-- As shard_meta, plus `_match`: whether the row matches a where that needs payload columns
-- (evaluated here, where the payload is; the coordinator samples with `_match` as its where).
SELECT m.* EXCLUDE (_batch), m.key IN (SELECT key FROM rollouts WHERE {where}) AS _match
FROM meta AS m
