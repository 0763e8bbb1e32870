-- Priorities set by `update_priority` (TorchRL-style): key -> priority. A row absent here takes its
-- priority from the sampler's expression (default abs(advantage)); see Catalog.priority_sql.
CREATE OR REPLACE TABLE priorities (key VARCHAR, priority DOUBLE);
