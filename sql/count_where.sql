SELECT count(*) AS n FROM {source} WHERE {where}
