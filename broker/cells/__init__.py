"""Cells: past one PostgreSQL primary (docs/guides/cells.md).

A cell is one stock PostgreSQL with its broker fleet. HAProxy routes each request to its tenant's cell
by the ``tenant`` claim of the bearer token and a map file (``haproxy``); ``local`` runs two cells and
the proxy on loopback ports (``queen cells up|down|status``); ``move`` moves a tenant between cells
(``queen tenant move``) behind a freeze that the cells' databases enforce.
"""
