"""An example third-party plugin, installed by the tests to check discovery through entry points."""
