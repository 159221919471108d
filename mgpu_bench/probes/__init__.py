"""The probes: one folder per measuring command (see probe.py for the protocol and the registry)."""
