"""The local API: HTTP/1.1 + JSON over a Unix socket (server and client)."""
