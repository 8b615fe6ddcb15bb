"""Building a graph: what ``soma.Graph`` is made of before it runs.

- ``policy``: ``.retry()`` and ``.time_limit()``, checked where they are written.
- ``dsl``: expressions of nodes, ``>>`` and ``|``, and what ``.named()``, ``.on()``, ``.at()``
  write on them.
- ``node``: ``soma.Node``, the base class of a node.
- ``decide``: ``soma.each``, ``soma.switch`` and ``soma.loop``, steps with sub-graphs.
- ``function``: nodes from plain functions (``@soma.node``) and torch modules.
- ``module``: ``Graph.module()``, a graph's nodes' torch modules as one ``nn.Module``.

Nothing here runs a graph. As it runs it imports only ``soma._soma`` and ``soma.errors``, never
a later stage (``soma._run``, ``soma.devices``, ``soma.cache``, ``soma.remote``, the graph's own
module, which it names for the typing only); ``tests/test_layout.py`` holds the order.
Importing this package imports none of its modules: each is imported by name.
"""
