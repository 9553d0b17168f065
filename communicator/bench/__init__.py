"""``communicator bench``: this library's collectives against torch.distributed and mmengine.dist.

One start of N local gloo ranks runs every case: a payload per rank (:mod:`.payloads`, :mod:`.cases`),
each op written once per implementation (:mod:`.ops`), timed round robin with results checked
once (:mod:`.timing`), then reported as a table (:mod:`.table`), a JSON record (:mod:`.record`)
and the targets met or missed (:mod:`.targets`).
"""
