"""The machinery behind :mod:`communicator.dist`, the drop-in for ``mmengine.dist``.

:mod:`~communicator.compat.backing` picks the communicator that serves each call,
:mod:`~communicator.compat.devices` moves nested data between devices,
:mod:`~communicator.compat.buckets` groups parameters for coalesced reductions,
:mod:`~communicator.compat.filed_results` collects results through a directory and
:mod:`~communicator.compat.switch` makes mmengine itself call :mod:`communicator.dist`.
"""
