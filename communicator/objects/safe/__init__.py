"""The ``"safe"`` serializer (:mod:`communicator.objects.safe.serializer`) and what it is made of: the allow-list, the
unpickler, the plain-stream check and the rebuilding of values from plain data."""
