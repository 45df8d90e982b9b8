"""Development mode: the mock Bridge (a real HTTP server speaking the Anthropic Messages API,
scripted per test, with a demo model and a demo curator), `sprite-os-dev` (dev_mode.py), and the
in-process harness that tests, benchmarks and the chaos suite drive Sprite OS with.

The mock Bridge needs the `dev` extra (aiohttp); nothing here runs on a deployed Sprite.
"""
