"""Loads the conformance plugin when pytest is pointed at this directory (``pytest conformance``)."""

from conformance.plugin import (  # noqa: F401  (hooks and fixtures are found by name)
    admin,
    api,
    api_b,
    api_consume_only,
    api_other,
    api_produce_only,
    hooks,
    measure,
    plan,
    pytest_addoption,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_report_teststatus,
    pytest_runtest_logreport,
    pytest_runtest_makereport,
    pytest_sessionstart,
    pytest_terminal_summary,
    target,
    tenant_a,
)
