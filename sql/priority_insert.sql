INSERT INTO priorities SELECT key, priority FROM priority_new
