"""The mock Bridge: a local HTTP server speaking the Anthropic Messages API for tests and dev runs.

async with MockBridge() as bridge:
    bridge.agent.script(Turn(ToolCall("mcp__canvas__create_card", {"title": "x"}), Text("Done.")))
    bridge.curator.script("NONE")
    bridge.faults.add(Fault("status", status=529, target="curator", times=1))
"""

from .request import RecordedRequest
from .script import CutOff, Fault, FaultSet, Step, Text, ToolCall, Turn
from .server import MockBridge

__all__ = ["CutOff", "Fault", "FaultSet", "MockBridge", "RecordedRequest", "Step", "Text", "ToolCall", "Turn"]
