"""Counts of everything the data pipeline reads, skips, drops and keeps.

Every stage reports into one `Tally` so that nothing is lost silently: each skip or drop
has a reason, and the first few locations of each reason are kept for the summary.
"""

from collections import Counter
from dataclasses import dataclass, field

MAX_EXAMPLES = 5  # locations remembered per reason; counts are always complete


@dataclass
class Tally:
    read: int = 0  # raw records the sources yielded
    skipped: Counter = field(default_factory=Counter)  # records the readers could not use, by reason
    dropped: Counter = field(default_factory=Counter)  # whole conversations dropped, by reason
    dropped_messages: Counter = field(default_factory=Counter)  # single messages dropped, by reason
    skipped_parts: Counter = field(default_factory=Counter)  # message content parts left out, by reason
    duplicates: int = 0
    truncated: int = 0  # conversations cut to max_length (and kept)
    kept: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        self._remember(reason, where)

    def drop(self, reason: str, where: str) -> None:
        self.dropped[reason] += 1
        self._remember(reason, where)

    def drop_message(self, reason: str, where: str) -> None:
        self.dropped_messages[reason] += 1
        self._remember(reason, where)

    def skip_part(self, reason: str, where: str) -> None:
        self.skipped_parts[reason] += 1
        self._remember(reason, where)

    def _remember(self, reason: str, where: str) -> None:
        locations = self.examples.setdefault(reason, [])
        if len(locations) < MAX_EXAMPLES:
            locations.append(where)

    def to_dict(self) -> dict:
        return {
            "read": self.read,
            "skipped": dict(self.skipped),
            "dropped": dict(self.dropped),
            "dropped_messages": dict(self.dropped_messages),
            "skipped_parts": dict(self.skipped_parts),
            "duplicates": self.duplicates,
            "truncated": self.truncated,
            "kept": self.kept,
            "examples": self.examples,
        }


def report_short_selection(asked: int | None, selected: int, sources: list[str], skipped: int) -> None:
    """Say so when the sources hold fewer conversations than data.max_conversations asked for."""
    if asked is not None and selected < asked:
        print(
            f"data.max_conversations={asked}, but the sources {sources} hold only {selected} usable "
            f"conversations after data.skip_conversations={skipped} and normalisation: using those",
            flush=True,
        )
