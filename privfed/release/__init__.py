"""The release as data: a plan of stages, one runner, and a trace every consumer reads.

* :class:`ReleasePlan` -- the ordered stages one (method, privacy, protection) runs;
  :meth:`ReleasePlan.run` / :meth:`ReleasePlan.release` execute them (the only
  in-process runner: ``fit``, the sweeps, the auditor and the attacks use it);
* :class:`ReleaseTrace` -- per stage what went in and out (clients, bound, sigma,
  bytes, randomness source), what the server received (:meth:`ReleaseTrace.server_view`),
  and the privacy events the accountant composed.
"""

from privfed.release.plan import ReleasePlan, keeping_uploads
from privfed.release.stages import UPLOAD_CHUNK_BYTES, check_secure_size
from privfed.release.trace import ReleaseTrace, ServerReceived, StageRecord

__all__ = [
    "UPLOAD_CHUNK_BYTES",
    "ReleasePlan",
    "ReleaseTrace",
    "ServerReceived",
    "StageRecord",
    "check_secure_size",
    "keeping_uploads",
]
