"""What fuse() did: every candidate module it swapped or left alone, with the reason."""
import collections
import dataclasses
from typing import List


@dataclasses.dataclass(frozen=True)
class Entry:
    path: str            # the module's name in the model ("" for the model itself)
    module_class: str
    kind: str
    swapped: bool
    detail: str          # how it was replaced (the proven variant's options), or why it was left alone
    summary: str = ""    # the same in a user's words, without the internal options


@dataclasses.dataclass
class FusionReport:
    model_class: str
    model_type: str = ""
    entries: List[Entry] = dataclasses.field(default_factory=list)

    @property
    def swapped(self) -> List[Entry]:
        return [entry for entry in self.entries if entry.swapped]

    @property
    def left_alone(self) -> List[Entry]:
        return [entry for entry in self.entries if not entry.swapped]

    def counts(self) -> collections.Counter:
        """Modules swapped per kind."""
        return collections.Counter(entry.kind for entry in self.swapped)

    def summary_rows(self, detailed: bool = False):
        """(kind, module class, 'swapped' or 'left alone', what, count), one row per distinct case; `what` is the
        entry's summary, or with `detailed` its detail (the proven options)."""
        rows = collections.Counter((e.kind, e.module_class, "swapped" if e.swapped else "left alone",
                                    e.detail if detailed else (e.summary or e.detail)) for e in self.entries)
        return [(*key, count) for key, count in sorted(rows.items(), key=lambda item: (item[0][0], item[0][2]))]

    def table(self, detailed: bool = False) -> str:
        """The report as a table, a row per distinct case; `detailed` shows each variant's options."""
        rows = [("kind", "module", "action", "count", "options" if detailed else "what")]
        rows += [(kind, cls, action, str(count), what)
                 for kind, cls, action, what, count in self.summary_rows(detailed)]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [f"fused_ops.fuse({self.model_class}{', ' + self.model_type if self.model_type else ''}):"]
        for row in rows:
            lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4])
        return "\n".join(lines)

    def details(self) -> str:
        """The table with the proven variants' options (what `str()` says in a user's words)."""
        return self.table(detailed=True)

    def __str__(self):
        return self.table()
