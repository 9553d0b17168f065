"""The public operations, written once over a communicator's primitives: the mixins
:class:`~communicator.base.Communicator` is made of, and what they share."""
