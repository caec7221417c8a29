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
    detail: str          # how it was replaced, or why it was left alone


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

    def summary_rows(self):
        """(kind, module class, 'swapped' or 'left alone', detail, count), one row per distinct case."""
        rows = collections.Counter((e.kind, e.module_class, "swapped" if e.swapped else "left alone", e.detail)
                                   for e in self.entries)
        return [(*key, count) for key, count in sorted(rows.items(), key=lambda item: (item[0][0], item[0][2]))]

    def __str__(self):
        rows = [("kind", "module", "action", "count", "detail")]
        rows += [(kind, cls, action, str(count), detail) for kind, cls, action, detail, count in self.summary_rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [f"fused_ops.fuse({self.model_class}{', ' + self.model_type if self.model_type else ''}):"]
        for row in rows:
            lines.append("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4])
        return "\n".join(lines)
