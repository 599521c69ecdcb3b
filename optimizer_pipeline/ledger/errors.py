"""Errors of the ledger: every refusal says why, and names the ledger, row or transition."""


class LedgerError(Exception):
    """A ledger operation was refused (its message says why)."""


class LedgerBusyError(LedgerError):
    """The ledger stayed locked by other processes past the retry bound."""


class RunStateError(LedgerError):
    """A run transition that the ledger refuses (e.g. finishing a run twice)."""


class NotFoundError(LedgerError):
    """A binding, run, recommendation or artifact that the ledger does not hold."""
