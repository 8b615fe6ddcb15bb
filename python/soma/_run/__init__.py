"""Running a graph, on the Python side: what the engine calls back into while it walks a run.

- ``observe``: the one observer the engine tells each work to, handing it to OpenTelemetry
  (``soma.telemetry``) and to event streams.
- ``loop``: the event loop Soma keeps for async nodes, and the futures the engine completes.
- ``events``: ``Graph.events`` and ``map_events``, a run's works as a stream of events.
- ``stream``: ``Graph.map`` and ``amap``, a graph over a stream of inputs.

As it runs it imports only the stages before it (``soma._build``, ``soma._soma``,
``soma.errors``), and names the graph and the cache for the typing only;
``tests/test_layout.py`` holds the order. Importing this package imports none of its modules:
each is imported by name.
"""
