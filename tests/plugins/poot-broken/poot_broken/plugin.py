import poot_broken_missing_dependency  # noqa: F401  - the failure under test
