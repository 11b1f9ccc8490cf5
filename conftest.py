pytest_plugins = ["poot.testing.fixtures", "poot.testing.device_suites"]
