-- Rows matching {where} (a sampler's population, counted only when its density estimate missed).
SELECT count(*) AS n FROM {source} WHERE {where}
