INSERT INTO meta SELECT * FROM meta_new
