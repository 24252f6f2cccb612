"""Per-host ledger of the reservations of running trials: admission, GPU placement, reaping of dead owners.

Owns the package's public names: ``_capacity`` (budgets, requests, usage), ``_db`` (tables, engine, errors,
``read_host``), ``_owners`` (process liveness), ``_queue`` (the order of admission: tickets, backfill, placement,
a try's plan), ``_commit`` (a try's read and its commit on the host's version), ``_ledger`` (the ``Ledger``);
knows nothing of Optuna, torch or estimates.
"""

from __future__ import annotations

from ._capacity import HostBudget, HostCapacity, Request, Usage, available_ram, describe, physical_ram
from ._db import Entry, LedgerError, Reaped, Ticket, check_ledger_url, default_url, read_host
from ._ledger import Ledger
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
