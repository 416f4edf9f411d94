"""End-to-end tests: real worker, frontend, indexer and ``jetfleet up`` processes driven as a user
drives them (HTTP through the official clients, NATS, the CLI as subprocesses); ``fleet.py``
builds the fleets.
"""
