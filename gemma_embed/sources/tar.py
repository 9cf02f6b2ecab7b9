"""Tar shards (webdataset's layout, as img2dataset and LAION write them), streamed member by member.

Read with the standard library's `tarfile`, not the `webdataset` package: `tarfile` is always there (webdataset
is one more dependency, with its own opener that starts `curl` or shell pipes for names it does not know), and
it lets every failure be named. webdataset's reader raises on a bad shard (or, with a `warn_and_continue`
handler, skips to the next one) without saying which members were lost; here each member is read on its own, so
a member whose data is cut is a failed item under its own key, the members before it are items, and what comes
after a cut or a corrupt header is accounted for (below). A shard is read front to back, a member at a time:
nothing is extracted to disk and memory holds one sample's members.

Samples follow webdataset's convention (its `base_plus_ext`): a member's sample key is its path up to the first
dot of its file name, the rest is the field (`000017.jpg`, `000017.txt`, `000017.json`: sample `000017`), and a
sample's members are consecutive in the shard (webdataset's TarWriter writes them so, in sorted field order; for a
shard made with the `tar` program, list a sample's files together, e.g. sorted). A member whose extension is one
the command decodes is an item keyed `SHARD:MEMBER` (the shard keyed as a file would be: as given, or relative to
a walked folder), so keys stay unique across shards whose sample keys repeat; its metadata has `member` (the
member's name) and, from its sample's sidecars, `caption` (the `.txt` member's text) and `json` (the `.json`
member, parsed; its text when it does not parse), so the output joins back to the dataset. Other members are
counted as skipped, like files a folder walk passes over, and are not read. A sample is held until its last member
is read, at most MAX_SAMPLE_BYTES (a larger one gives its items the sidecars read so far).

Memory is bounded by the member's header, before its data is read: a member larger than the collection's
`max_item_bytes` fails under its key, unread. A GNU sparse member (its holes are not stored: a 40 KB shard can
declare a 10 GiB member) is measured by its expanded size, so one over the limit is refused the same way, and one
within it is read into a buffer of that size (its stored chunks placed at their offsets), never more. Members that
are no regular files are counted in `skipped` by kind (`SkippedMember`: directory, symlink, hardlink, fifo,
character device, block device), for the run's note; a symbolic or hard link is followed only to a regular member
that comes earlier in the same shard (a hard link always does; tar stores the data once, at the first name), and
read from there as that member; a link that leads anywhere else (outside the shard: absolute, or climbing out with
`..`; to no member; to a later one) is not followed.

A shard that stops early is named: a member whose data is cut fails under its key; a shard that ends between
members without tar's end-of-archive marker fails under the shard's own key ("truncated"); a corrupt header is a
failure under the shard's key giving its byte offset, and reading resumes at the next valid header (the members
in the bytes skipped are lost, and the line says how many bytes). Data after the end-of-archive marker (another
archive appended, as `cat a.tar b.tar` makes) is read too.
"""

from __future__ import annotations

import posixpath
import re
import tarfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from gemma_embed import nested_json
from gemma_embed.locations import Location, NotRegularFile, location
from gemma_embed.media import MediaBytes
from gemma_embed.sources.base import SkippedMember, Source, item_too_large

SUFFIXES = (".tar",)
SIDECARS = {"txt": "caption", "json": "json"}  # a sample's field -> the metadata key its text goes to
MAX_SAMPLE_BYTES = 256 << 20  # a sample's members held while waiting for the rest of the sample
BLOCK = tarfile.BLOCKSIZE
SCAN_BYTES = 1 << 20  # read this much at a time when looking for the next valid header
_SAMPLE = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")  # webdataset's base_plus_ext, one dot-less leading name


def is_shard(path: Location) -> bool:
    return path.name.lower().endswith(SUFFIXES)


def sample_key(name: str) -> tuple[str, str]:
    """(sample key, field) of a member name, as webdataset groups members: "a/000017.jpg" -> ("a/000017",
    "jpg"); "x.seg.png" -> ("x", "seg.png"); a name without a dot is a sample of its own with no field."""
    match = _SAMPLE.match(name)
    return (match.group(1), match.group(2)) if match else (name, "")


@dataclass
class _Member:
    name: str
    data: MediaBytes | None = None  # None when not read (counting, not wanted) or when it could not be read
    error: str | None = None
    kind: str = "unreadable"  # with `error`: what happened (errors.RECORD_KINDS)


@dataclass
class _NotAFile:
    """A member that is no regular file (nor a link followed to one): skipped, counted by kind."""

    name: str
    kind: str


@dataclass
class _Problem:
    """A failure of the shard itself (not of a member it names): truncated, corrupt header, unreadable."""

    message: str


@dataclass
class _Sample:
    key: str | None = None
    members: list[_Member] = field(default_factory=list)
    size: int = 0


def members(
    path: Location,
    shard_key: str,
    wanted: frozenset[str],
    skipped: Counter | None = None,
    read: bool = True,
    max_bytes: int | None = None,
) -> Iterator[Source]:
    """The items of one shard, in member order: each member with a `wanted` extension (its bytes, its sample's
    sidecars), then failures as they are met; a member over `max_bytes` fails unread. With `read=False` only the
    headers are read (members' data is skipped by seeking): what is yielded is only good for counting."""
    sample = _Sample()
    seen: set[str] = set()

    def flush() -> Iterator[Source]:
        meta = _sidecar_meta(sample.members)
        takes = any(_wanted(m.name, wanted) for m in sample.members)
        for member in sample.members:
            if member.name in seen:
                if _wanted(member.name, wanted):
                    yield Source(
                        f"{shard_key}:{member.name}",
                        str(path),
                        error="another member of this name comes earlier in the shard; this one is not embedded",
                        kind="duplicate",
                    )
                continue
            seen.add(member.name)
            if _wanted(member.name, wanted) or member.error is not None:
                yield Source(
                    f"{shard_key}:{member.name}",
                    str(path),
                    error=member.error,
                    kind=member.kind if member.error is not None else None,
                    data=member.data,
                    meta={"member": member.name, **meta} if member.error is None else {},
                )
            elif not (takes and sample_key(member.name)[1].lower() in SIDECARS) and skipped is not None:
                skipped[_suffix(member.name) or "(none)"] += 1
        sample.members.clear()
        sample.size = 0

    for event in _read_shard(path, read, wanted, max_bytes):
        if isinstance(event, _Problem):
            yield from flush()
            yield Source(shard_key, str(path), error=event.message, kind="unreadable")
            continue
        if isinstance(event, _NotAFile):
            if skipped is not None:
                skipped[SkippedMember(shard_key, event.kind)] += 1
            continue
        key = sample_key(event.name)[0]
        if key != sample.key or sample.size > MAX_SAMPLE_BYTES:
            yield from flush()
            sample.key = key
        sample.members.append(event)
        sample.size += len(event.data or b"")
    yield from flush()


@dataclass(frozen=True)
class Shard:
    """A shard left whole (a `sources.base.Unit`): whoever reads it streams its members itself (`members`), so that a
    Ray run's driver sends the shard's location, not its bytes (nor its headers: a remote shard's headers are read
    with its members, a read-ahead block at a time)."""

    path: str
    key: str  # the shard's key: its items are SHARD:MEMBER
    wanted: frozenset[str]
    max_bytes: int | None

    def items(self, keys: object = None, skipped: Counter | None = None) -> Iterator[Source]:
        return members(location(self.path), self.key, self.wanted, skipped, True, self.max_bytes)


def _suffix(name: str) -> str:
    return posixpath.splitext(name)[1].lower()


def _wanted(name: str, wanted: frozenset[str]) -> bool:
    return _suffix(name) in wanted


def _read_for(name: str, wanted: frozenset[str]) -> bool:
    """Whether a member's data is read: an item, or a sidecar (a caption, JSON) its sample's items may take."""
    return _wanted(name, wanted) or sample_key(name)[1].lower() in SIDECARS


def _sidecar_meta(sample: list[_Member]) -> dict:
    """caption and json from a sample's .txt and .json members (webdataset's fields, any case)."""
    meta = {}
    for member in sample:
        target = SIDECARS.get(sample_key(member.name)[1].lower())
        if target is None or member.data is None or target in meta:
            continue
        text = member.data.decode("utf-8", errors="replace")
        if target == "json":
            try:
                meta[target] = nested_json.loads(text)
            except ValueError:  # not JSON, or nested too deep (nested_json.TooDeep): kept as its text
                meta[target] = text
        else:
            meta[target] = text
    return meta


# ------------------------------------------------------------------------------------------ reading a shard


@dataclass(frozen=True, slots=True)
class _Data:
    """Where a regular member's data lies in the shard: what a link to it reads (one is kept per regular member
    read so far, so it is small)."""

    offset: int
    size: int  # expanded size for a sparse member
    sparse: tuple[tuple[int, int], ...] | None  # (offset, length) of each stored chunk of a sparse member

    @property
    def stored(self) -> int:
        return self.size if self.sparse is None else sum(length for _, length in self.sparse)


class _Cut(Exception):
    """The shard ends inside a member's data."""

    def __init__(self, have: int):
        self.have = have


# tarfile's member types that are no regular files, as the skipped note names them.
_KINDS = {
    tarfile.DIRTYPE: "directory",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
    tarfile.FIFOTYPE: "fifo",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
}


def _read_shard(
    path: Location,
    read: bool,
    wanted: frozenset[str] = frozenset(),
    max_bytes: int | None = None,
) -> Iterator[_Member | _NotAFile | _Problem]:
    """Regular-file members in order (with their bytes when `read` and the member is an item or a sidecar),
    members that are no files, and a _Problem wherever the shard stops making sense; after a corrupt header,
    reading goes on at the next valid one."""
    try:
        path.regular_file("a tar shard")
    except NotRegularFile as exc:
        yield _Problem(str(exc))
        return
    except OSError:
        pass  # open says why, below
    try:
        fh = path.open_input()  # closed below; a generator must own its file
    except NotRegularFile as exc:  # swapped in after the stat above
        yield _Problem(str(exc))
        return
    except OSError as exc:
        yield _Problem(f"cannot open the shard: {exc.strerror or exc}")
        return
    with fh:
        start = 0
        last = None  # the last member read, for messages
        regular: dict[str, _Data] = {}  # the regular members so far, by normalised name: where links lead
        while start is not None:
            fh.seek(start)
            try:
                archive = tarfile.open(fileobj=fh, mode="r:")
            except tarfile.ReadError as exc:
                yield _Problem(f"not a readable tar file ({exc})")
                return
            while True:
                try:
                    info = archive.next()
                except tarfile.ReadError as exc:
                    if "unexpected end of data" in str(exc):  # the last member's data is cut (not read: counting)
                        yield _Problem(f"truncated: the data of member {last} is cut")
                        return
                    start = _next_header(fh, archive.offset + BLOCK)
                    yield _Problem(
                        f"corrupt tar header at byte {archive.offset} ({exc}); {_skipped(archive.offset, start, fh)}"
                    )
                    break
                if info is None:
                    start = yield from _after_end(fh, archive.offset, last)
                    break
                archive.members.clear()  # tarfile keeps every header it reads; a long shard must not grow memory
                if info.isreg():
                    sparse = tuple(tuple(chunk) for chunk in info.sparse) if info.sparse is not None else None
                    data = regular[posixpath.normpath(info.name)] = _Data(info.offset_data, info.size, sparse)
                elif info.issym() or info.islnk():
                    data = _link_target(info, regular)
                    if data is None:
                        yield _NotAFile(info.name, _KINDS[info.type])
                        continue
                else:
                    yield _NotAFile(info.name, _KINDS.get(info.type, "other"))
                    continue
                last = info.name
                if not _read_for(info.name, wanted):
                    yield _Member(info.name)
                    continue
                if max_bytes is not None and data.size > max_bytes:
                    what = "the member" if data.sparse is None else f"the sparse member ({data.stored} bytes stored)"
                    yield _Member(info.name, error=item_too_large(data.size, max_bytes, what), kind="too-large")
                    continue
                if not read:
                    yield _Member(info.name)
                    continue
                try:
                    content = _read_data(fh, data)
                except _Cut as cut:
                    yield _Member(
                        info.name,
                        error=f"truncated shard: the member's data is cut after {cut.have} of {data.stored} bytes; "
                        f"nothing after it can be read",
                    )
                    return
                except ValueError as exc:  # a sparse map that does not fit its member
                    yield _Member(info.name, error=str(exc))
                    continue
                member = _Member(info.name, MediaBytes(content, posixpath.basename(info.name)))
                del content  # before yielding: the MediaBytes is the one copy held while the item waits
                yield member


def _link_target(info: tarfile.TarInfo, regular: dict[str, _Data]) -> _Data | None:
    """The data of the earlier regular member of this shard a link leads to; None when it leads anywhere else.
    A symbolic link's target is relative to the link's own folder, a hard link's to the archive's root."""
    if posixpath.isabs(info.linkname):
        return None
    base = posixpath.dirname(info.name) if info.issym() else ""
    target = posixpath.normpath(posixpath.join(base, info.linkname))
    if target == ".." or target.startswith("../"):
        return None
    return regular.get(target)


def _read_data(fh, data: _Data) -> bytes | bytearray:
    """A regular member's bytes, read straight from the shard (no copy through tarfile's reader). A sparse
    member's stored chunks are read into a zeroed buffer of its expanded size (checked against the limit before)."""
    fh.seek(data.offset)
    if data.sparse is None:
        content = fh.read(data.size)
        if len(content) < data.size:
            raise _Cut(len(content))
        return content
    content = bytearray(data.size)
    view = memoryview(content)
    have = 0
    for offset, length in data.sparse:
        if offset < 0 or length < 0 or offset + length > data.size:
            raise ValueError(
                f"corrupt sparse member: a chunk of {length} bytes at {offset} lies outside its {data.size} bytes"
            )
        got = fh.readinto(view[offset : offset + length])
        have += got
        if got < length:
            raise _Cut(have)
    return content


def _truncated(last: str | None) -> str:
    after = f"after member {last}" if last else "before its first member"
    return f"truncated: the shard ends {after} without tar's end-of-archive marker; any later members are lost"


def _after_end(fh, offset: int, last: str | None) -> Iterator[_Problem]:
    """tarfile stopped at `offset` without an error: a clean end (zero blocks to the end of the file), a shard
    cut short, or a header it could not parse (which tarfile treats as the end). Returns where to go on
    reading (another archive appended, or the next valid header after a corrupt one), or None."""
    fh.seek(offset)
    block = fh.read(BLOCK)
    if not block:
        yield _Problem(_truncated(last))
        return None
    if len(block) < BLOCK:
        yield _Problem(f"truncated: the shard ends inside a member header at byte {offset}")
        return None
    if block.count(0) == BLOCK:  # the end-of-archive marker: anything but zeros after it is another archive
        data_at = _next_nonzero_block(fh, offset + BLOCK)
        if data_at is None:
            return None
        following = _next_header(fh, data_at)
        if following != data_at:
            yield _Problem(
                f"corrupt shard: data after the end-of-archive marker at byte {offset} is not a tar header "
                + _skipped(data_at, following, fh)
            )
        return following
    name = block[:100].split(b"\0", 1)[0].decode("utf-8", errors="replace")
    following = _next_header(fh, offset + BLOCK)
    yield _Problem(
        f"corrupt tar header at byte {offset}" + (f" (its name field reads {name!r})" if name else "") + "; "
        f"{_skipped(offset, following, fh)}"
    )
    return following


def _skipped(start: int, following: int | None, fh) -> str:
    if following is None:
        return f"nothing readable after it ({fh.seek(0, 2) - start} bytes lost)"
    return f"{following - start} bytes skipped to the next valid header (the members in them are lost)"


def _next_nonzero_block(fh, offset: int) -> int | None:
    fh.seek(offset)
    while chunk := fh.read(SCAN_BYTES):
        stripped = chunk.lstrip(b"\0")
        if stripped:
            return offset + (len(chunk) - len(stripped)) // BLOCK * BLOCK
        offset += len(chunk)
    return None


def _next_header(fh, offset: int) -> int | None:
    """The offset of the next block at or after `offset` that parses as a tar header (its checksum holds), or
    None. Candidates are blocks with the ustar magic at byte 257, which tarfile, GNU tar and webdataset all
    write."""
    offset = (offset + BLOCK - 1) // BLOCK * BLOCK
    while True:
        fh.seek(offset)
        chunk = fh.read(SCAN_BYTES + BLOCK)
        if len(chunk) < BLOCK:
            return None
        found = chunk.find(b"ustar", 257)
        while found != -1:
            start = found - 257
            if start % BLOCK == 0 and start + BLOCK <= len(chunk):
                try:
                    tarfile.TarInfo.frombuf(chunk[start : start + BLOCK], tarfile.ENCODING, "surrogateescape")
                    return offset + start
                except tarfile.HeaderError:
                    pass
            found = chunk.find(b"ustar", found + 1)
        if len(chunk) < SCAN_BYTES + BLOCK:
            return None
        offset += SCAN_BYTES
