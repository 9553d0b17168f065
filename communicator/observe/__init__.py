"""What a communicator shows of itself.

- :mod:`~communicator.observe.events`: one record per public call, and the flight recorder;
- :mod:`~communicator.observe.stats`: per-operation statistics summed from those records;
- :mod:`~communicator.ops.observation`: the ``Communicator`` mixin that installs statistics,
  hooks and profiles, and dumps the recorder;
- :mod:`~communicator.observe.traces`: reading the ranks' dumps together (``communicator trace``).
"""
