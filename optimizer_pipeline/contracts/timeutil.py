"""Time stamps of the vocabulary: aware UTC datetimes and their ISO 8601 text."""

from datetime import datetime, timezone


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(moment: datetime) -> datetime:
    """`moment` as an aware UTC datetime; a naive one is taken as UTC (as the ledger's TIMESTAMP columns hold it)."""
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def iso_utc(moment: datetime) -> str:
    """ISO 8601 in UTC with an explicit offset, seconds precision kept to microseconds."""
    return as_utc(moment).isoformat()


def iso_from_seconds(seconds: float) -> str:
    """`iso_utc` of a time given in seconds since the epoch (how samples are stored)."""
    return iso_utc(datetime.fromtimestamp(float(seconds), timezone.utc))


def parse_iso_utc(text: str) -> datetime:
    return as_utc(datetime.fromisoformat(text))
