-- Metadata columns of every lake row: what samplers select keys on (no payload read).
CREATE OR REPLACE TEMP VIEW meta AS SELECT {columns} FROM rollouts;
CREATE OR REPLACE TEMP VIEW cold AS SELECT * FROM rollouts;
CREATE OR REPLACE TEMP VIEW lake AS SELECT * FROM rollouts;
