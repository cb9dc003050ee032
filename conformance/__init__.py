"""The queen conformance suite: a black-box pytest suite that checks a broker speaking the Queen wire
against the contract catalogue (``conformance/catalogue.py``), over HTTP only.

Run it with ``queen conformance --url URL --token T ...`` (``conformance/runner.py``) or
``pytest conformance --queen-url URL``. ``conformance/mutants.py`` is a proxy that breaks one contract
at a time, to prove the suite can fail.
"""
