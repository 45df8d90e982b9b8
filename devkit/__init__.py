"""Development mode: the mock Bridge (a real HTTP server speaking the Anthropic Messages API,
scripted per test, with a demo model and a demo curator), dev mode (dev_mode.py, what `make run`
runs), and the in-process harness that tests, benchmarks and the chaos suite drive Sprite OS with.

The mock Bridge needs the `dev` extra (aiohttp). None of it is installed (the wheel ships `sprite_os`
only) or deployed: it runs from the checkout, whose root `make` and pytest put on the import path.
"""
