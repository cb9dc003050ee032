"""The KV store: validation (``ops``), the one-round-trip apply (``store``), the transaction rider
(``rider``) and the expiry pruner (``pruner``). HTTP lives in ``broker.http.kv``."""
