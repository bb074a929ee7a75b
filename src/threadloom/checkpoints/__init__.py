"""File checkpoints: a shadow git repository per project, outside the user's repository.

Pure storage: no database, no engine. The engine records what these functions return.
See docs/checkpoints.md.
"""

from threadloom.checkpoints.diffs import FileChange, FileStatus
from threadloom.checkpoints.errors import CheckpointError, CheckpointErrorCode
from threadloom.checkpoints.refs import REF_PREFIX, ROOT_SCOPE, checkpoint_ref
from threadloom.checkpoints.repo import Capture, Restored, ShadowRepo
from threadloom.checkpoints.store import CheckpointStore

__all__ = [
    "REF_PREFIX",
    "ROOT_SCOPE",
    "Capture",
    "CheckpointError",
    "CheckpointErrorCode",
    "CheckpointStore",
    "FileChange",
    "FileStatus",
    "Restored",
    "ShadowRepo",
    "checkpoint_ref",
]
