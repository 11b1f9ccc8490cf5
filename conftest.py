pytest_plugins = ["poot.testing.fixtures"]
