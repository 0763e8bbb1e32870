-- The coordinator's catalog: `meta` (and `rollouts`, metadata only) over the union of the shards'
-- metadata rows, registered as the Arrow table {source}.
CREATE OR REPLACE TEMP VIEW meta AS SELECT * FROM {source};
CREATE OR REPLACE TEMP VIEW rollouts AS SELECT * FROM {source};
