"""The Debian package (scripts/package): built once per session, then inspected."""
