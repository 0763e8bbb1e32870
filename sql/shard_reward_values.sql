-- A shard's partial result for the `reward` sampler's top/bottom-fraction cuts: the reward of every
-- row matching {where} (4-8 B a row, not the row's metadata); the coordinator takes the quantiles of
-- the union, exactly as one buffer would over all its rows (lakebuffer.distributed.draw.partial_of).
SELECT reward FROM {source} WHERE {where}
