"""Chart archives unpacked and charts taken into krypton's cache (SPEC R6, R6b): only what a
chart is made of, within bounds, under a directory named from the checked name and version,
never from what the archive says of itself."""

from __future__ import annotations

import io
import re
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from krypton.decisions.charts.versions import parse_version
from krypton.decisions.errors import ChartNotLoaded, VersionInvalid
from krypton.decisions.trust import safeyaml


def adopt(unpacked: Path, dest: Path, what: str, expect_name: str,
          expect_version: str | None, suffix: str = "") -> Path:
    """Move the one chart directory of `unpacked` into `dest` and return its new path.

    The chart must be `expect_name` (and `expect_version` when given) with a valid semver.
    Its directory name is built from those checked values (plus `suffix`), never from the
    archive's own metadata, so a hostile Chart.yaml cannot place files outside `dest`.
    """
    charts = [p for p in unpacked.iterdir()
              if not p.is_symlink() and (p / "Chart.yaml").is_file()]
    if len(charts) != 1:
        raise ChartNotLoaded(f"chart archive for {what} has no single chart")
    meta = chart_metadata(charts[0])
    got_name, got_version = str(meta.get("name", "")), str(meta.get("version", ""))
    if got_name != expect_name:
        raise ChartNotLoaded(f"chart archive for {what} contains chart "
                             f"{got_name[:64]!r}, not {expect_name!r}")
    if expect_version is not None and got_version != expect_version:
        raise ChartNotLoaded(f"chart archive for {what} contains version "
                             f"{got_version[:64]!r}, not {expect_version!r}")
    try:
        parse_version(got_version)
    except VersionInvalid as exc:
        raise ChartNotLoaded(f"chart {expect_name} has an invalid version "
                             f"{got_version[:64]!r}") from exc
    target = dest / _safe_component(f"{expect_name}-{got_version}{suffix}")
    if target.resolve().parent != dest.resolve():
        raise ChartNotLoaded(f"chart {expect_name} {got_version[:64]!r} cannot be "
                             "stored safely")
    if not target.exists():
        charts[0].rename(target)
    return target


MAX_UNPACKED = 100 << 20  # bytes of a chart archive's files, all together
MAX_ENTRIES = 10_000


def unpack_archive(archive: bytes, dest: Path, what: str, expect_name: str,
                   suffix: str) -> Path:
    """Unpack a packaged chart (.tgz) fetched by krypton itself into `dest`; returns the
    chart directory (see :func:`adopt`). Only regular files and directories under one top
    directory are taken, within MAX_UNPACKED bytes and MAX_ENTRIES entries: no link, device,
    absolute path or ``..`` leaves the scratch directory."""
    dest.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="unpack-", dir=dest))
    try:
        try:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
                total = 0
                for n, member in enumerate(tar):
                    parts = PurePosixPath(member.name).parts
                    if n >= MAX_ENTRIES:
                        raise ChartNotLoaded(f"chart archive for {what} has over {MAX_ENTRIES} entries")
                    if not parts or member.name.startswith("/") or ".." in parts:
                        raise ChartNotLoaded(f"chart archive for {what} has an unsafe path")
                    target = scratch.joinpath(*parts)
                    if member.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    if not member.isfile():
                        continue  # links, devices and fifos are not part of a chart
                    total += member.size
                    if total > MAX_UNPACKED:
                        raise ChartNotLoaded(f"chart archive for {what} unpacks to over "
                                             f"{MAX_UNPACKED} bytes")
                    source = tar.extractfile(member)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with source as src, target.open("wb") as out:  # type: ignore[union-attr]
                        shutil.copyfileobj(src, out)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ChartNotLoaded(f"chart archive for {what} is not a readable .tgz: {exc}") from exc
        return adopt(scratch, dest, what, expect_name, None, suffix)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _safe_component(text: str) -> str:
    """One path component: letters, digits, '.', '_', '+' and '-'; never '.' or '..'."""
    cleaned = re.sub(r"[^A-Za-z0-9._+-]", "_", text)[:200]
    return cleaned if cleaned.strip(".") else "_"


def chart_metadata(chart_dir: Path) -> dict[str, Any]:
    """Chart.yaml of an unpacked chart, parsed within limits; ChartNotLoaded if unusable."""
    try:
        meta = safeyaml.load((chart_dir / "Chart.yaml").read_bytes(), safeyaml.CHART_METADATA,
                             what="Chart.yaml")
    except (OSError, safeyaml.YamlRejected) as exc:
        raise ChartNotLoaded(f"chart {chart_dir.name}: {exc}") from exc
    if not isinstance(meta, dict):
        raise ChartNotLoaded(f"chart {chart_dir.name}: Chart.yaml is not a mapping")
    return meta


def chart_version(chart_dir: Path) -> str:
    return str(chart_metadata(chart_dir).get("version", ""))
