-- The keys of the cold batches (registered as cold_batches_now): a scan's filter of the lake files.
SELECT m.key FROM meta m JOIN cold_batches_now b ON m._batch = b._batch
