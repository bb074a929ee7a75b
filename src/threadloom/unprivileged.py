"""Agents run as an unprivileged user: the uid they get, and the files the server hands over to it.

An agent process (and, for a `full_access` Codex or Claude Code thread, every command it runs without a
sandbox) would otherwise run as the server's user -- root in many deployments -- and could write the server's
package, read the data dir, reach the embedded PostgreSQL's socket and mint tokens. When the server runs as
root, `child_process.contained` starts every agent as `THREADLOOM_AGENT_UID`/`THREADLOOM_AGENT_GID` (default
65534, nobody) instead; a server that is not root cannot switch users and its agents run as itself (one
warning at start).

That user owns only what the server hands it:

- its state folder `<agent state dir>/<instance>/<project>/` (0700, with everything already in it), under
  folders that are only traversable (0711) and stay root's, so it can never rename its own folder away;
- the project's workspace and each of the project's forks' folders: a POSIX ACL entry `user:<uid>:rwx`
  on every file and folder, and a default ACL on folders so what anyone creates later inherits it
  (`grant_workspace`, at every agent start). ACLs rather than a chown, so the workspace keeps its owner
  and the files the operator put there stay theirs; on a file system without ACLs the entries are
  chowned to the agent user instead. Files a restore writes are chowned to the agent user as they are
  created (`give`): an inherited ACL's mask comes from the create mode, which for 0644 would leave the agent
  read-only on a file it must edit after a rollback.

Every walk here goes through O_NOFOLLOW descriptors (the trees are the agent's, so hostile input): a link
is never followed, never chowned, never given an ACL; nor is a file with more than one hard link (its inode
may also have a name outside the workspace, and an ACL or owner belongs to the inode).

The setting is process-wide (`configure`, from `Services.build`): one server per process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import stat
import struct
import subprocess
from collections.abc import Iterable
from pathlib import Path

from threadloom import nofollow

log = logging.getLogger("threadloom.unprivileged")

DEFAULT_UID = DEFAULT_GID = 65534  # nobody / nogroup
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

# The kernel's xattr form of a POSIX ACL (linux/posix_acl_xattr.h): version 2, then (tag, perm, id) entries
# sorted by tag. No `acl` package needed.
_ACL_VERSION = 2
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ID = 0xFFFFFFFF
ACCESS_ACL = "system.posix_acl_access"
DEFAULT_ACL = "system.posix_acl_default"


@dataclasses.dataclass(frozen=True, slots=True)
class AgentUser:
    uid: int
    gid: int

    def setpriv_args(self) -> list[str]:
        """`setpriv` options switching to this user with no supplementary groups (root's would stay otherwise)."""
        return ["--reuid", str(self.uid), "--regid", str(self.gid), "--clear-groups"]


_current: AgentUser | None = None


def configure(uid: int, gid: int) -> AgentUser | None:
    """Agents run as `uid`/`gid` from now on if this process is root; else they run as it (logged once)."""
    global _current
    if os.geteuid() != 0:
        if _current is None:
            log.warning(
                "the server does not run as root, so its agents run as its own user (uid %d): an agent's "
                "command can read and write whatever this user can (docs/deploy.md, 'The agent user')",
                os.geteuid(),
            )
        _current = None
        return None
    _current = AgentUser(uid, gid)
    if not _hardlinks_protected():
        log.warning(
            "fs.protected_hardlinks is not 1: an agent could hard-link a file it cannot write into its workspace "
            "and the workspace grant would give it that file (docs/security.md, 'The workspace grant')"
        )
    return _current


def _hardlinks_protected() -> bool:
    """Whether the kernel lets a user hard-link only files it may read and write (`fs.protected_hardlinks`)."""
    try:
        with open("/proc/sys/fs/protected_hardlinks") as setting:
            return setting.read().strip() == "1"
    except OSError:
        return False


def current() -> AgentUser | None:
    """The user agents run as, or None when they run as the server's own user."""
    return _current


def give(fd: int) -> None:
    """Hand the open file or folder `fd` (just made by the server for a workspace) to the agent user."""
    if _current is not None:
        os.fchown(fd, _current.uid, _current.gid)


# ---- what the agent user can reach ---------------------------------------------------------------------

_PROBE = 'for p; do [ -x "$p" ] || { printf %s "$p"; exit 1; }; done'
_reached: set[str] = set()  # paths the agent user was seen to reach (kept for the process: they rarely change)


class CannotReach(Exception):
    """The agent user cannot reach `path` (`blocked` is the first folder or file on the way it cannot pass)."""

    def __init__(self, path: str, blocked: str, user: AgentUser) -> None:
        super().__init__(
            f"the agent user (uid {user.uid}) cannot reach {blocked}"
            + ("" if blocked == path else f" on the way to {path}")
            + ": it and every folder above it must be executable (searchable) by that user"
            " (docs/deploy.md, 'The agent user')"
        )
        self.path, self.blocked = path, blocked


def check_reach(paths: Iterable[str]) -> None:
    """Raise `CannotReach` unless the agent user can execute each of `paths` (a program, or a folder it must
    enter) and search every folder above it. The kernel answers, not the mode bits read here: one `setpriv`
    probe runs `test -x` as that user on what was not seen reachable yet (ACLs, links and all). Positive
    answers are kept for the process; a refusal is asked again next time (the operator may fix it)."""
    user = _current
    if user is None:
        return
    steps: dict[str, str] = {}  # each path and folder on the way -> the path it leads to
    for path in paths:
        target = Path(os.path.abspath(path))
        for step in (*reversed(target.parents[:-1]), target):
            steps.setdefault(str(step), str(target))
    todo = [step for step in steps if step not in _reached]
    if not todo:
        return
    probe = subprocess.run(
        ["setpriv", *user.setpriv_args(), "--", "/bin/sh", "-c", _PROBE, "sh", *todo],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode == 0:
        _reached.update(todo)
        return
    if probe.stdout not in steps:  # setpriv itself failed: nothing can start as the agent user
        raise CannotReach(todo[0], f"anything (setpriv failed: {probe.stderr.strip()})", user)
    _reached.update(todo[: todo.index(probe.stdout)])  # the probe passed these before it stopped
    raise CannotReach(steps[probe.stdout], probe.stdout, user)


# ---- the state folder -----------------------------------------------------------------------------------


def own_state_dir(instance_dir: Path, project_dir: str) -> None:
    """Make `instance_dir/project_dir` the agent user's own folder (0700), its parent traversable only.

    `instance_dir` is made if missing and kept root's at 0711 (so the agent can reach its folder, not list
    or rename it). What is already inside (made by an older release running agents as root, or by the driver)
    is chowned to the agent user, walking by descriptor."""
    instance_dir.mkdir(parents=True, exist_ok=True)
    user = _current
    if user is None:
        (instance_dir / project_dir).mkdir(exist_ok=True)
        return
    os.chmod(instance_dir, 0o711)
    top = os.open(instance_dir, _DIR)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(project_dir, 0o700, dir_fd=top)
        fd = os.open(project_dir, _DIR, dir_fd=top)
    finally:
        os.close(top)
    try:
        os.fchmod(fd, 0o700)
        _chown_tree(fd, user)
    finally:
        os.close(fd)


def agent_folders(state: Path, names: Iterable[str]) -> None:
    """Folders (relative paths) inside the project's state folder `state`, made as the agent user's.

    The server makes them before the agent starts (the agent's HOME, CODEX_HOME, TMPDIR); made as root they
    would be unwritable by it. Each component is opened with O_NOFOLLOW: the agent may have put a link there."""
    for name in names:
        fd = os.open(state, _DIR)
        try:
            for part in Path(name).parts:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
                inner = os.open(part, _DIR, dir_fd=fd)
                os.close(fd)
                fd = inner
                give(fd)
        finally:
            os.close(fd)


def put_file(folder: Path, name: str, content: bytes, mode: int = 0o644) -> None:
    """Replace `folder/name` with `content` as a whole (a reader sees the old file or the new one).

    `folder` is the agent's own: the file is staged with O_CREAT|O_EXCL|O_NOFOLLOW in a folder opened without
    following links and renamed into place, so a link the agent planted at either name is replaced, never
    written through (`threadloom.nofollow`)."""
    fd = nofollow.open_folder(folder)
    try:
        nofollow.put_file_at(fd, name, content, mode)
    finally:
        os.close(fd)


def _chown_tree(fd: int, user: AgentUser) -> None:
    """Chown the folder `fd` and everything below it to `user`; links and what they point at are left alone."""
    info = os.fstat(fd)
    if (info.st_uid, info.st_gid) != (user.uid, user.gid):
        os.fchown(fd, user.uid, user.gid)
    for entry in os.scandir(fd):
        try:
            if entry.is_dir(follow_symlinks=False):
                inner = os.open(entry.name, _DIR, dir_fd=fd)
                try:
                    _chown_tree(inner, user)
                finally:
                    os.close(inner)
            elif not entry.is_symlink():
                found = entry.stat(follow_symlinks=False)
                if (found.st_uid, found.st_gid) != (user.uid, user.gid):
                    os.chown(entry.name, user.uid, user.gid, dir_fd=fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError, OSError) as error:
            if error.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise


# ---- workspaces ---------------------------------------------------------------------------------------


def _acl(owner: int, user: AgentUser, group: int, other: int, granted: int) -> bytes:
    entries = [
        (_USER_OBJ, owner, _NO_ID),
        (_USER, granted, user.uid),
        (_GROUP_OBJ, group, _NO_ID),
        (_MASK, granted | group, _NO_ID),
        (_OTHER, other, _NO_ID),
    ]
    return struct.pack("<I", _ACL_VERSION) + b"".join(struct.pack("<HHI", *entry) for entry in entries)


def _access_acl(mode: int, user: AgentUser, folder: bool, found: bytes | None) -> bytes:
    """The access ACL granting `user`, keeping the owner's, group's and others' permissions: from the ACL
    already there if any (with an ACL the mode's group bits are its mask, not the group's), else the mode."""
    owner, group, other = (mode >> 6) & 7, (mode >> 3) & 7, mode & 7
    if found is not None and len(found) >= 4 and (len(found) - 4) % 8 == 0:
        for offset in range(4, len(found), 8):
            tag, perm, _ = struct.unpack_from("<HHI", found, offset)
            if tag == _GROUP_OBJ:
                group = perm
    granted = 0o7 if folder or owner & 0o1 else 0o6
    return _acl(owner, user, group, other, granted)


def _xattr(fd_or_path: int | str, name: str) -> bytes | None:
    try:
        if isinstance(fd_or_path, int):
            return os.getxattr(fd_or_path, name)
        return os.getxattr(fd_or_path, name, follow_symlinks=False)
    except OSError:
        return None


def grant_workspace(root: str | Path) -> None:
    """Let the agent user read and write the workspace `root`: an ACL entry on each file and folder below it,
    and a default ACL on folders. Entries already granted are left as they are, links are skipped.
    A root that is missing or is a link is left alone (the agent's start reports the workspace)."""
    user = _current
    if user is None:
        return
    try:
        fd = os.open(root, _DIR)
    except OSError:
        return
    try:
        _grant_folder(fd, user)
    finally:
        os.close(fd)


def _grant_folder(fd: int, user: AgentUser) -> None:
    """Grant one folder and everything below it. A file with more than one hard link is skipped: an ACL (or
    chown) is set on the inode, which a name outside the workspace may share, and granting it would grant
    that outside file. The agent user keeps what the file's own mode gives it."""
    info = os.fstat(fd)
    found = _xattr(fd, ACCESS_ACL)
    wanted, inherited = _access_acl(info.st_mode, user, True, found), _acl(0o7, user, 0o5, 0o5, 0o7)
    if found != wanted or _xattr(fd, DEFAULT_ACL) != inherited:
        try:
            os.setxattr(fd, ACCESS_ACL, wanted)
            os.setxattr(fd, DEFAULT_ACL, inherited)
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            os.fchown(fd, user.uid, user.gid)  # no ACLs on this file system: the agent's own then
    for entry in os.scandir(fd):
        try:
            if entry.is_dir(follow_symlinks=False):
                inner = os.open(entry.name, _DIR, dir_fd=fd)
                try:
                    _grant_folder(inner, user)
                finally:
                    os.close(inner)
            elif entry.is_file(follow_symlinks=False):
                # Read by the name relative to the folder's descriptor, the last component not followed.
                path = f"/proc/self/fd/{fd}/{entry.name}"
                info = entry.stat(follow_symlinks=False)
                if info.st_nlink > 1:
                    continue  # a hard link: its other name may be outside the workspace (`_grant_folder`)
                found = _xattr(path, ACCESS_ACL)
                if found != _access_acl(info.st_mode, user, False, found):
                    _grant_file(fd, entry.name, user)
        except OSError as error:
            # Changed under the walk (removed, or swapped for a link or file): it is the agent's doing.
            if error.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EPERM):
                raise


def _grant_file(folder: int, name: str, user: AgentUser) -> None:
    """Grant `user` the file `name` of the open folder `folder`, through a descriptor of that very file: a
    link swapped in since the folder was listed is not opened (O_NOFOLLOW), so neither it nor its target is
    granted or chowned; nor is anything that is not a regular file."""
    try:
        file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=folder)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO, errno.EACCES):
            return
        raise
    try:
        info = os.fstat(file)
        if not stat.S_ISREG(info.st_mode):
            return
        found = _xattr(file, ACCESS_ACL)
        wanted = _access_acl(info.st_mode, user, False, found)
        if found == wanted:
            return
        try:
            os.setxattr(file, ACCESS_ACL, wanted)
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP):
                raise
            os.fchown(file, user.uid, user.gid)  # no ACLs on this file system: the agent's own then
    finally:
        os.close(file)


# ---- the data dir -------------------------------------------------------------------------------------


def close_data_dir(data_dir: Path, reachable: Iterable[str], private: Iterable[str] = ()) -> None:
    """The data dir as the agent user may see it: the data dir and the folders on the way to what agents use
    (`reachable`: agents' state, forks' workspaces) traversable only (0711), everything else in it 0700
    (the embedded PostgreSQL's folder, checkpoints' shadow git dirs, locks).

    The data dir and these folders are made here when missing (most are made lazily, later, with the
    default 0755): `private` names those made 0700 now so that what is made in them later stays closed."""
    if _current is None:
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(data_dir, 0o711)
    keep = set(reachable)
    for name in (*keep, *private):
        with contextlib.suppress(FileExistsError):
            os.mkdir(data_dir / name, 0o711 if name in keep else 0o700)
    for entry in os.scandir(data_dir):
        if entry.is_symlink():
            continue
        with contextlib.suppress(FileNotFoundError):
            if entry.is_dir():
                os.chmod(entry.path, 0o711 if entry.name in keep else 0o700)
            else:  # a file (the admin-token): closed, and not made executable
                os.chmod(entry.path, 0o600)
