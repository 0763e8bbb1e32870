pytest_plugins = ["tests.s3server"]
