-- Groups (or episodes) with at least one row matching {where}.
SELECT count(DISTINCT {gid}) AS n FROM {source} WHERE {where} AND {gid} IS NOT NULL
