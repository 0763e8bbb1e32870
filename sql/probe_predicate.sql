-- Binds a predicate against a relation without running it (which columns does it need?).
SELECT 1 FROM {source} WHERE {where} LIMIT 0
