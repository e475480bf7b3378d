"""The command line: the parser, the client commands and the API client, text output,
``run``, the OCI hook, ``-w``, the demo. The top layer: may import every stage; nothing
imports it. Client commands import the daemon's modules lazily, to stay light.
"""
