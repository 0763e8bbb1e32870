-- Per-tier views over the registered Arrow objects (hot: in-RAM tables, warm: the Lance dataset).
CREATE OR REPLACE VIEW hot AS SELECT * FROM hot_data;
CREATE OR REPLACE VIEW warm AS SELECT * FROM warm_data;
