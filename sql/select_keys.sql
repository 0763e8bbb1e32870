SELECT key FROM {source} WHERE {where}
