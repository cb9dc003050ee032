"""queen-broker: a multi-tenant message broker on PostgreSQL with durable one-shot timers."""

__version__ = "0.1.0"
