-- Stream live rollouts of one consistent snapshot of the hot and warm tiers.
SELECT {columns} FROM (SELECT * FROM hot_data UNION ALL BY NAME SELECT * FROM warm_data)
WHERE {where}
