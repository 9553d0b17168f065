"""The extension point: the communicators over a transport, and the ``torch.distributed`` backend.

A transport is a subclass of :class:`~communicator.base.Communicator` that supplies its four abstract
members (``rank``, ``world_size``, ``_isend``, ``_irecv``); the ones here are the library's own.
"""
