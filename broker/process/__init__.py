"""The process machinery, apart from the domain: the ``queen`` command line (``cli``), the master that
binds the port and supervises workers (``supervisor``), one worker's HTTP server (``server``), the
supervised background loops (``loops``), logging set-up (``logsetup``) and a broker started as a child
process for tests, benches and the harness (``localserver``)."""
