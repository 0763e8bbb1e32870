-- Per-tier views over the registered Arrow objects (hot: in-RAM tables, warm: the memory-mapped
-- fragments, cold_data: the lake files holding rows that left local disk).
-- cold_rows keeps only the rows of cold batches (cold_batches: their ids; meta maps keys to batches):
-- a lake file also holds rows still local, which hot/warm serve, so no row is seen twice.
CREATE OR REPLACE VIEW hot AS SELECT * FROM hot_data;
CREATE OR REPLACE VIEW warm AS SELECT * FROM warm_data;
CREATE OR REPLACE VIEW cold_rows AS
SELECT {cold_columns} FROM cold_data
WHERE key IN (SELECT m.key FROM meta m JOIN cold_batches b ON m._batch = b._batch);
