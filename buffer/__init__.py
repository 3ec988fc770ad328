"""The replay buffer: wire format, staleness-aware service and its client.

Modules: `records` (Group/Sample), `wire` (+ `wire_group`, `checks`: msgpack wire format and its
validation), `admission` (the staleness rule), `core` (buffer logic), `snapshot`, `service` (the ZMQ
process), `process` (spawns the service), `client` (BufferClient). Imports only zmq, msgpack, numpy
and the standard library.
"""
