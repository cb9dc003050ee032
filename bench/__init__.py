"""pytest-benchmark benches (``queen bench``); not part of the default test run."""
