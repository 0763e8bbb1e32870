-- Bytes DuckDB holds now (the meta table, mostly): counted against the buffer's RAM budget.
SELECT sum(memory_usage_bytes) FROM duckdb_memory()
