"""Per-host ledger of the reservations of running trials: admission, GPU placement, reaping of dead owners.

Owns the package's public names: ``_capacity`` (budgets, requests, usage), ``_db`` (tables, engine, errors),
``_owners`` (process liveness), ``_queue`` (the order of admission: tickets, backfill, placement), ``_ledger``
(the ``Ledger`` and ``read_host``); knows nothing of Optuna, torch or estimates.
"""

from __future__ import annotations

from ._capacity import HostBudget, HostCapacity, Request, Usage, available_ram, describe, physical_ram
from ._db import Entry, LedgerError, Reaped, Ticket, check_ledger_url, default_url
from ._ledger import Ledger, read_host
from ._owners import owner_alive, start_of

__all__ = [
    "HostBudget",
    "HostCapacity",
    "Request",
    "Entry",
    "Reaped",
    "Ticket",
    "Usage",
    "Ledger",
    "LedgerError",
    "owner_alive",
    "start_of",
    "default_url",
    "read_host",
    "check_ledger_url",
    "available_ram",
    "physical_ram",
    "describe",
]
