"""Image references in one canonical form, parsed by the registry's reference grammar.

``docker_image.reference`` (docker-image-py) follows distribution's grammar and Docker's
normalisation, so ``python``, ``python:latest`` and ``docker.io/library/python:latest`` are one
image here as they are to the Docker Engine.  The canonical form is what Hoist stores and
compares: the full registry host and path, the tag (``latest`` when neither a tag nor a digest
is given, as Docker pulls), and the digest if one was given.  A reference with a registry host
(``localhost:5000/busybox:1``) keeps its host and path as written.

Doors (a command that takes an image) call ``canonical``: a bad reference is refused with the
grammar's reason, naming the field.  Readers of events call ``canonical_or_same``: events
written before this form keep theirs in the log and are folded onto the canonical one (a
reference no grammar accepts is kept as it is: it names no image anyone could pull).
``familiar`` is the short form for tables, as ``docker images`` shows it.
"""

from __future__ import annotations

from functools import lru_cache

from docker_image.reference import InvalidReference, Reference

from domain.errors import InvalidField
from domain.limits import MAX_IMAGE

_DOCKER_HUB = "docker.io/"
_OFFICIAL = "docker.io/library/"
_EXAMPLE = (
    "use a reference like python:3.12, team/app:1 or registry.example.com:5000/app@sha256:..."
)


def _parse(ref: str) -> str:
    """The canonical form of ``ref``; InvalidReference/ValueError with the grammar's reason."""
    if ref != ref.strip() or not ref:
        raise InvalidReference("invalid reference format: empty, or blank around the name")
    parsed = Reference.parse_normalized_named(ref)
    name, tag, digest = parsed["name"], parsed["tag"], parsed["digest"]
    out = name
    if tag or not digest:
        out += f":{tag or 'latest'}"  # Docker pulls :latest when nothing is named
    if digest:
        out += f"@{digest}"
    return out


@lru_cache(maxsize=4096)
def _canonical(ref: str) -> str | Exception:
    try:
        out = _parse(ref)
    except (InvalidReference, ValueError, TypeError) as e:  # TypeError: the library's own slip
        return e
    if len(out) > MAX_IMAGE:
        return InvalidReference(f"longer than {MAX_IMAGE} characters once made canonical")
    return out


def _reason(error: Exception) -> str:
    text = str(error) or type(error).__name__
    if not text.startswith("invalid"):
        text = f"invalid reference format: {text}"
    return text


def _show(ref: str) -> str:
    return repr(ref if len(ref) <= 80 else f"{ref[:77]}...")


def canonical(ref: object, field: str = "image") -> str:
    """``ref`` in the canonical form, e.g. ``python`` -> ``docker.io/library/python:latest``;
    InvalidField naming ``field`` with the grammar's reason if it is no image reference."""
    if not isinstance(ref, str):
        raise InvalidField(field, f"must be an image reference (a string), got {ref!r}; {_EXAMPLE}")
    out = _canonical(ref)
    if isinstance(out, Exception):
        raise InvalidField(field, f"{_reason(out)} (got {_show(ref)}); {_EXAMPLE}")
    return out


def canonical_all(refs: list[str], field: str = "images") -> list[str]:
    """Each reference canonical (InvalidField names ``field[i]``), duplicates dropped in order."""
    return list(dict.fromkeys(canonical(r, f"{field}[{i}]") for i, r in enumerate(refs)))


def canonical_or_same(ref: str) -> str:
    """For readers of stored events and engines: the canonical form, or ``ref`` itself if it
    has none (or is an image id, ``sha256:...``, which the grammar would take for a name)."""
    if ref.startswith("sha256:"):
        return ref
    out = _canonical(ref)
    return ref if isinstance(out, Exception) else out


def canonical_repository(repo: object, field: str = "repository") -> str:
    """A repository without tag or digest in canonical form (``ml/torch`` ->
    ``docker.io/ml/torch``); InvalidField naming ``field`` otherwise."""
    out = canonical(repo, field)
    parsed = Reference.parse_normalized_named(repo)
    if parsed["tag"] or parsed["digest"]:
        raise InvalidField(field, f"must be a repository without a tag or digest, got {repo!r}")
    return out.removesuffix(":latest")


def repository_of(image: str) -> tuple[str, str]:
    """``repo:tag`` -> (repo, tag), the one place a reference is split; a ':' before the last
    '/' is a registry port, not a tag, and a digest is no tag (``latest`` when none is given)."""
    image = image.partition("@")[0]
    slash, colon = image.rfind("/"), image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon + 1 :]
    return image, "latest"


def familiar(ref: str) -> str:
    """The short form for displays: Docker Hub's host and ``library/`` left out, the tag kept
    (``docker.io/library/python:latest`` -> ``python:latest``), as ``docker images`` shows."""
    if ref.startswith(_OFFICIAL) and "/" not in ref[len(_OFFICIAL) :]:
        return ref[len(_OFFICIAL) :]
    if ref.startswith(_DOCKER_HUB):
        return ref[len(_DOCKER_HUB) :]
    return ref
