SELECT {columns} FROM rollouts WHERE {where}
