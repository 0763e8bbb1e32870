COALESCE((SELECT p.priority FROM priorities AS p WHERE p.key = {source}.key), ({default})::DOUBLE)
