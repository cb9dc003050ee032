"""Load and capacity harness: Locust scenarios, a runner that starts or targets a broker, and reports.

``queen loadtest SCENARIO ...`` (``loadtest.runner.main``) is the entry point; each scenario is also a
plain locustfile (``locust -f loadtest/timers_lag.py --host http://127.0.0.1:6632``).
"""
