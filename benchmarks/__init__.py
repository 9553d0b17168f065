"""The studies behind the performance page, outside the wheel (``communicator bench`` runs them from a checkout).

For each world size asked for, a start of N local gloo ranks runs every case: a payload per rank
(:mod:`.payloads`, :mod:`.cases`), each op written once per implementation (:mod:`.ops`, the
floors of :mod:`.floor`), timed round robin with results checked once (:mod:`.timing`), the
``records`` case also split into phases (:mod:`.phases`), then reported as a table
(:mod:`.table`), a JSON record (:mod:`.record`) and the targets met or missed (:mod:`.targets`);
several world sizes end with a summary across them (:mod:`.scaling`). The ``tensor-path`` case
(:mod:`.tensor_path`) times a tensor inside an object against the tensor ops, on ranks of its own.
"""
