"""Fetch Maven jars for an image build, verified; `--list` names them, one coordinate a line.

A line is `group:artifact:version [sha256]` (`#` starts a comment). For each, the POM and
the jar are downloaded from `--repo` and checked against the repository's published `.sha1`
(required) and `.sha512` (when published); the jar also against the sha256 on its line, when
given. Each POM's compile and runtime dependencies must be in the list or among the jars in
`--provided-dir` (Spark's own): a missing one fails the build by name here, not a Spark job
later. Nothing is written to `--dest` unless every check passed. Prints `coordinate sha256`
per jar on stdout (ready to pin in the list); progress goes to stderr.
Standard library only: it runs in the image build before anything else is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ATTEMPTS = 3
TIMEOUT_S = 60.0
USER_AGENT = "mqaudit-image-build (fetch_maven_jars.py)"
INCLUDED_SCOPES = ("compile", "runtime")


class FetchError(Exception):
    """A download, a checksum or a dependency that does not check out."""


class NotFound(FetchError):
    pass


@dataclass(frozen=True)
class Coordinate:
    group: str
    artifact: str
    version: str
    sha256: str | None = None

    @property
    def name(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}.jar"

    def url(self, repo: str, ext: str) -> str:
        path = "/".join([*self.group.split("."), self.artifact, self.version])
        return f"{repo.rstrip('/')}/{path}/{self.artifact}-{self.version}.{ext}"


def parse_list(text: str, source: str = "list") -> list[Coordinate]:
    coords = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        parts = fields[0].split(":")
        if len(fields) > 2 or len(parts) != 3 or not all(parts):
            raise ValueError(f"{source}:{number}: expected 'group:artifact:version [sha256]'")
        sha256 = fields[1].lower() if len(fields) == 2 else None
        if sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise ValueError(f"{source}:{number}: {fields[1]!r} is not a sha256 hex digest")
        group, artifact, version = parts
        coords.append(Coordinate(group, artifact, version, sha256))
    if not coords:
        raise ValueError(f"{source}: no coordinates")
    return coords


def fetch(url: str) -> bytes:
    """The body at `url`; NotFound on 404, retried on other failures."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise NotFound(f"{url}: not found (404)") from None
            error = f"HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:
            error = str(getattr(e, "reason", e))
        if attempt < ATTEMPTS:
            print(f"  {url}: {error}; retrying", file=sys.stderr)
            time.sleep(2.0 * attempt)
    raise FetchError(f"{url}: {error} after {ATTEMPTS} attempts")


def published_digest(text: bytes, url: str) -> str:
    """The hex digest of a `.sha1`/`.sha512` file ("<hex>" or "<hex>  <file name>")."""
    fields = text.decode("ascii", "replace").split()
    if not fields or not re.fullmatch(r"[0-9a-fA-F]+", fields[0]):
        raise FetchError(f"{url}: not a checksum file")
    return fields[0].lower()


def verified(repo: str, coord: Coordinate, ext: str) -> bytes:
    """Download one file of `coord` and check it against the repository's checksums."""
    url = coord.url(repo, ext)
    data = fetch(url)
    sha1 = published_digest(fetch(url + ".sha1"), url + ".sha1")
    if hashlib.sha1(data).hexdigest() != sha1:
        raise FetchError(f"{url}: sha1 does not match the published {url}.sha1")
    try:
        sha512 = published_digest(fetch(url + ".sha512"), url + ".sha512")
    except NotFound:
        sha512 = None  # older uploads publish md5 and sha1 only
    if sha512 is not None and hashlib.sha512(data).hexdigest() != sha512:
        raise FetchError(f"{url}: sha512 does not match the published {url}.sha512")
    return data


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


@dataclass(frozen=True)
class Dependency:
    group: str
    artifact: str
    version: str
    # (group, artifact) patterns, `*` for any, the dependent excludes from this one's own.
    exclusions: frozenset[tuple[str, str]] = frozenset()


def pom_dependencies(pom: bytes, source: str) -> list[Dependency]:
    """The POM's non-optional compile and runtime dependencies."""
    try:
        root = ET.fromstring(pom)
    except ET.ParseError as e:
        raise FetchError(f"{source}: not an XML POM ({e})") from None
    top = {_local(child.tag): child for child in root}
    props = {
        _local(p.tag): (p.text or "").strip()
        for p in (top["properties"] if "properties" in top else [])
    }
    for key in ("version", "groupId", "artifactId"):
        if key in top:
            props[f"project.{key}"] = (top[key].text or "").strip()

    def resolve(value: str) -> str:
        def one(match: re.Match[str]) -> str:
            if match.group(1) not in props:
                raise FetchError(f"{source}: cannot resolve ${{{match.group(1)}}}")
            return props[match.group(1)]

        return re.sub(r"\$\{([^}]+)\}", one, value)

    deps = []
    for dep in top["dependencies"] if "dependencies" in top else []:
        fields = {_local(f.tag): (f.text or "").strip() for f in dep}
        scope = fields.get("scope") or "compile"
        if scope not in INCLUDED_SCOPES or fields.get("optional") == "true":
            continue
        if not fields.get("version"):
            raise FetchError(f"{source}: {fields.get('artifactId')} has no version")
        exclusions = frozenset(
            (
                resolve((ex.findtext("{*}groupId") or "*").strip()),
                resolve((ex.findtext("{*}artifactId") or "*").strip()),
            )
            for ex in dep.iter()
            if _local(ex.tag) == "exclusion"
        )
        deps.append(
            Dependency(
                resolve(fields["groupId"]),
                resolve(fields["artifactId"]),
                resolve(fields["version"]),
                exclusions,
            )
        )
    return deps


def _excluded(group: str, artifact: str, patterns: set[tuple[str, str]]) -> bool:
    return any(g in ("*", group) and a in ("*", artifact) for g, a in patterns)


def provided_versions(provided_dir: Path | None) -> dict[str, set[str]]:
    """artifact -> versions of the `artifact-version.jar` files already on Spark's classpath."""
    found: dict[str, set[str]] = {}
    for jar in sorted(provided_dir.glob("*.jar")) if provided_dir else []:
        match = re.fullmatch(r"(.+?)-(\d[^-]*(?:-[^-]+)*)\.jar", jar.name)
        if match:
            found.setdefault(match.group(1), set()).add(match.group(2))
    return found


def check_dependencies(
    coords: list[Coordinate], poms: dict[str, bytes], provided: dict[str, set[str]]
) -> list[str]:
    """Problems with the POMs' dependencies (empty: all satisfied); notes go to stderr. A
    dependency that a listed POM excludes from the one that brings it in is not needed (as
    Maven and Ivy resolve it)."""
    listed = {(c.group, c.artifact): c.version for c in coords}
    deps = {c.name: pom_dependencies(poms[c.name], c.name) for c in coords}
    excluded: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for found in deps.values():
        for d in found:
            excluded.setdefault((d.group, d.artifact), set()).update(d.exclusions)
    problems = []
    for coord in coords:
        skip = excluded.get((coord.group, coord.artifact), set())
        for dep in deps[coord.name]:
            group, artifact, version = dep.group, dep.artifact, dep.version
            if _excluded(group, artifact, skip):
                continue
            if (group, artifact) in listed:
                if listed[(group, artifact)] != version:
                    problems.append(
                        f"{coord.name} needs {group}:{artifact}:{version}, "
                        f"the list has {listed[(group, artifact)]}"
                    )
            elif artifact in provided:
                if version not in provided[artifact]:
                    have = ", ".join(sorted(provided[artifact]))
                    print(
                        f"  note: {coord.name} asks for {artifact} {version}; "
                        f"Spark's own {have} is used",
                        file=sys.stderr,
                    )
            else:
                problems.append(
                    f"{coord.name} needs {group}:{artifact}:{version}, which is neither listed "
                    "nor among the provided jars: add it to the list"
                )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repo", required=True, help="Maven repository base URL")
    parser.add_argument("--list", type=Path, required=True, help="coordinates file")
    parser.add_argument("--dest", type=Path, required=True, help="directory for the jars")
    parser.add_argument("--provided-dir", type=Path, default=None, help="jars already there")
    args = parser.parse_args(argv)
    try:
        coords = parse_list(args.list.read_text(), str(args.list))
    except (OSError, ValueError) as e:
        print(f"fetch_maven_jars: {e}", file=sys.stderr)
        return 2
    if args.provided_dir is not None and not args.provided_dir.is_dir():
        print(f"fetch_maven_jars: {args.provided_dir} is not a directory", file=sys.stderr)
        return 2
    jars: dict[str, bytes] = {}
    poms: dict[str, bytes] = {}
    try:
        for coord in coords:
            print(f"fetching {coord.name}", file=sys.stderr)
            poms[coord.name] = verified(args.repo, coord, "pom")
            jar = verified(args.repo, coord, "jar")
            if coord.sha256 is not None and hashlib.sha256(jar).hexdigest() != coord.sha256:
                raise FetchError(f"{coord.name}: sha256 does not match the pinned {coord.sha256}")
            jars[coord.name] = jar
        problems = check_dependencies(coords, poms, provided_versions(args.provided_dir))
    except FetchError as e:
        print(f"fetch_maven_jars: {e}", file=sys.stderr)
        return 1
    if problems:
        for problem in problems:
            print(f"fetch_maven_jars: {problem}", file=sys.stderr)
        return 1
    args.dest.mkdir(parents=True, exist_ok=True)
    for coord in coords:
        target = args.dest / coord.file_name
        tmp = target.with_name(target.name + ".part")
        tmp.write_bytes(jars[coord.name])
        tmp.replace(target)
        print(f"{coord.name} {hashlib.sha256(jars[coord.name]).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
