"""user.md as the demo curator writes it and the demo model reads it: `- Key: value` lines.

Any other line (a heading, a paragraph, a person's own notes) is kept as it is.
"""

from __future__ import annotations

import re

from sprite_os.memory.files import SPECS

_LINE = re.compile(r"^\s*[-*]\s+(?P<key>[^:\n]{1,60}?)\s*:\s+(?P<value>\S.*?)\s*$")
USER_MD = SPECS["user.md"]


class Profile:
    def __init__(self, text: str) -> None:
        self.lines = text.strip("\n").split("\n") if text.strip() else []

    @classmethod
    def from_boot_prompt(cls, system: str) -> Profile:
        """user.md as the loader put it in a session's system prompt."""
        start_marker = f"## {USER_MD.title} ({USER_MD.name})\n"
        start = system.find(start_marker)
        if start < 0:
            return cls("")
        start += len(start_marker)
        ends = [system.find(marker, start) for marker in _SECTION_STARTS]
        text = system[start:min([e for e in ends if e >= 0], default=len(system))]
        return cls("" if text.strip() == USER_MD.empty else text)

    def items(self) -> list[tuple[str, str]]:
        return [(m["key"], m["value"]) for line in self.lines if (m := _LINE.match(line))]

    def values(self, key: str) -> list[str]:
        return [v for k, v in self.items() if k.lower() == key.lower()]

    def add(self, key: str, value: str) -> None:
        """A new `- key: value` line, after the last such line (or at the end)."""
        self.lines = [x for x in self.lines if x.strip() != USER_MD.empty]
        if not any(x.strip() for x in self.lines):
            self.lines = [f"# {USER_MD.title}", ""]
        last = max((i for i, x in enumerate(self.lines) if _LINE.match(x)), default=len(self.lines) - 1)
        self.lines.insert(last + 1, f"- {key}: {value}")

    def replace(self, key: str, value: str) -> None:
        """`key`'s one line, where its first line was."""
        first = next(i for i, x in enumerate(self.lines) if (m := _LINE.match(x)) and m["key"].lower() == key.lower())
        self.lines[first] = f"- {key}: {value}"
        self.lines = [x for i, x in enumerate(self.lines)
                      if i == first or not ((m := _LINE.match(x)) and m["key"].lower() == key.lower())]

    def text(self) -> str:
        return "\n".join(self.lines).strip("\n") + "\n"


# What follows user.md in the boot prompt: the next file's heading, or the loader's own sections.
_SECTION_STARTS = (
    *(f"\n## {spec.title} ({name})" for name, spec in SPECS.items() if name != USER_MD.name),
    "\n## Pending actions", "\n## Learned in the last", f"\n[{USER_MD.name} was cut",
)
