"""Time stamps of the vocabulary: aware UTC datetimes and their ISO 8601 text."""

from datetime import datetime, timezone


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def iso_utc(moment: datetime) -> str:
    """ISO 8601 in UTC with an explicit offset, seconds precision kept to microseconds."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat()


def iso_from_seconds(seconds: float) -> str:
    """`iso_utc` of a time given in seconds since the epoch (how samples are stored)."""
    return iso_utc(datetime.fromtimestamp(float(seconds), timezone.utc))


def parse_iso_utc(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
